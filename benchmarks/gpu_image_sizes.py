"""Where an image's bytes are (benchmarks/gpu-image.md). Run inside the image, it prints JSON:

    docker run --rm --network=none --entrypoint python -v $PWD/benchmarks/gpu_image_sizes.py:/m.py:ro IMAGE /m.py

- sizes: on-disk bytes of each installed distribution (the files of its RECORD; a file that two
  distributions both install counts for the one whose RECORD hash it has, i.e. the one pip wrote last)
- overwritten: per distribution, how many of its files another distribution's copy replaced
- nvidia_dirs, venv_bytes: `du -sb` of site-packages/nvidia/* and of /opt/venv
"""

import base64
import hashlib
import json
import os
import subprocess
import sysconfig
from collections import defaultdict
from importlib import metadata


def du(path: str) -> int | None:
    out = subprocess.run(["du", "-sb", path], capture_output=True, text=True).stdout.split()
    return int(out[0]) if out else None


def main() -> None:
    claims: dict[str, dict[str, str | None]] = defaultdict(dict)
    versions = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"].lower().replace("_", "-")
        versions[name] = dist.version
        for file in dist.files or []:
            claims[os.path.realpath(file.locate())][name] = file.hash.value if file.hash else None
    sizes: dict[str, int] = defaultdict(int)
    overwritten: dict[str, int] = defaultdict(int)
    for path, by in claims.items():
        try:
            size = os.lstat(path).st_size
        except FileNotFoundError:
            continue
        if len(by) == 1:
            sizes[next(iter(by))] += size
            continue
        with open(path, "rb") as f:
            digest = base64.urlsafe_b64encode(hashlib.sha256(f.read()).digest()).rstrip(b"=").decode()
        winners = [name for name, recorded in by.items() if recorded == digest]
        sizes[winners[0] if winners else "(unknown)"] += size
        for name in by:
            if name not in winners:
                overwritten[name] += 1
    nvidia = os.path.join(sysconfig.get_paths()["purelib"], "nvidia")
    dirs = (
        {entry: du(os.path.join(nvidia, entry)) for entry in sorted(os.listdir(nvidia))}
        if os.path.isdir(nvidia)
        else {}
    )
    print(
        json.dumps(
            {
                "sizes": sizes,
                "versions": versions,
                "overwritten": overwritten,
                "nvidia_dirs": dirs,
                "venv_bytes": du("/opt/venv"),
            },
            indent=1,
            sort_keys=True,
        )
    )


if __name__ == "__main__":
    main()
