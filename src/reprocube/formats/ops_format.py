"""OPS.json, the recording of one replayed step's operations (written by reprocube.training.replay, compared by
reprocube.analysis.first_differing_operation): the format's version and the marker of a step's input, here
beside the writer and below the engine that judges it, so that no trainer imports that engine."""

OPS_VERSION = 1
# JAX's and TensorFlow's recordings hold the step's inputs (one STEP_INPUT entry each) and its kernels only.
STEP_INPUT = "reprocube.step_input"
