import pytest

from reprocube.config import config_differences, config_hash, load_config, to_plain
from reprocube.errors import ConfigError


def test_defaults_match_the_reference_tutorial():
    cfg = load_config([])
    assert (cfg.framework.name, cfg.seed, cfg.epochs, cfg.batch_size, cfg.test_batch_size) == ("pytorch", 0, 4, 32, 64)
    assert (cfg.optimizer.lr, cfg.optimizer.momentum) == (0.01, 0.5)
    assert cfg.deterministic is True


def test_overrides_use_hydra_grammar():
    cfg = load_config(["epochs=3", "seed=1", "data.train_limit=2048", "dataset=mnist"])
    assert (cfg.epochs, cfg.seed, cfg.data.train_limit, cfg.dataset.name) == (3, 1, 2048, "mnist")


def test_user_yaml_is_merged_under_the_command_line(tmp_path):
    user = tmp_path / "train.yaml"
    user.write_text("epochs: 7\nseed: 3\ndataset: mnist\noptimizer:\n  lr: 0.05\nrun_name: \"it's mine\"\n")
    cfg = load_config(["seed=5"], str(user))
    assert (cfg.epochs, cfg.seed, cfg.optimizer.lr, cfg.dataset.name, cfg.run_name) == (7, 5, 0.05, "mnist", "it's mine")


@pytest.mark.parametrize(
    "content, message",
    [
        ("epochz: 3\n", "invalid configuration"),
        ("- epochs\n", "must hold a mapping"),
        ("epochs: [1\n", "not valid yaml"),
    ],
)
def test_bad_user_yaml_is_refused(tmp_path, content, message):
    user = tmp_path / "train.yaml"
    user.write_text(content)
    with pytest.raises(ConfigError, match=message):
        load_config([], str(user))


def test_missing_user_yaml_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="cannot read config file"):
        load_config([], str(tmp_path / "absent.yaml"))


@pytest.mark.parametrize(
    "override, message",
    [
        ("epochz=3", "invalid configuration"),
        ("epochs=0", "epochs must be an integer >= 1"),
        ("epochs=two", "epochs must be an integer"),
        ("seed=-1", "seed must be an integer in"),
        ("seed=4294967296", "seed must be an integer in"),
        ("device=tpu", "device must be auto, cpu or cuda"),
        ("framework=caffe", "invalid configuration"),
        ("data.train_limit=0", "data.train_limit must be an integer >= 1"),
        ("optimizer.lr=nan", "optimizer.lr must be a finite number"),
        ("run_name=a/b", "run_name must be a plain directory name"),
        ("epochs=", "epochs must be an integer"),
    ],
)
def test_bad_values_are_refused(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config([override])


def test_config_hash_ignores_places_and_epochs_only():
    base = to_plain(load_config([]))
    same = to_plain(load_config(["epochs=9", "output_dir=/elsewhere", "run_name=x", "data_dir=/d", "resume=latest"]))
    assert config_hash(base) == config_hash(same)
    for override in ("seed=1", "threads=1", "optimizer.lr=0.02", "data.train_limit=10", "deterministic=false"):
        assert config_hash(to_plain(load_config([override]))) != config_hash(base), override


def test_config_differences_name_the_keys():
    a = to_plain(load_config([]))
    b = to_plain(load_config(["seed=2", "optimizer.momentum=0.9", "epochs=10"]))
    assert config_differences(a, b) == ["optimizer.momentum: 0.5 -> 0.9", "seed: 0 -> 2"]
