"""The user commands, one module each (train, download, verify, compare, report, bench, study);
reprocube.cli maps their names to them. The engine they drive (config, data, state, checkpoint, runs,
loop, backend, frameworks, env, rng) lives beside this package and never imports it."""
