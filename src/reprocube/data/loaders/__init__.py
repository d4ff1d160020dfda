"""Each framework's standard loader behind reprocube.data.pipeline.BatchPipeline (data.pipeline=loader)."""
