from reprocube.cli import run

run()
