"""Datasets: IDX files, their verified local store, the downloader, and the data order."""
