import subprocess
import sys

import pytest
import yaml

from reprocube.config import (
    FORMER_RESULT_KEYS,
    config_differences,
    config_hash,
    config_hash_matches,
    load_config,
    to_plain,
)
from reprocube.errors import EXIT_CONFIG, ConfigError


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
    user.write_text('epochs: 7\nseed: 3\ndataset: mnist\noptimizer:\n  lr: 0.05\nrun_name: "it\'s mine"\n')
    cfg = load_config(["seed=5"], [str(user)])
    assert (cfg.epochs, cfg.seed, cfg.optimizer.lr, cfg.dataset.name, cfg.run_name) == (
        7,
        5,
        0.05,
        "mnist",
        "it's mine",
    )


def test_later_config_files_override_earlier_ones(tmp_path):
    train, extra = tmp_path / "train.yaml", tmp_path / "verify.yaml"
    train.write_text("epochs: 7\nseed: 3\n")
    extra.write_text("epochs: 2\nverify:\n  mid_epoch: true\n")
    cfg = load_config([], [str(train), str(extra)])
    assert (cfg.epochs, cfg.seed, cfg.verify.mid_epoch) == (2, 3, True)


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
        load_config([], [str(user)])


def test_missing_user_yaml_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="absent.yaml is missing"):
        load_config([], [str(tmp_path / "absent.yaml")])


@pytest.mark.parametrize(
    "override, message",
    [
        ("epochz=3", "invalid configuration"),
        ("epochs=0", "epochs must be an integer >= 1"),
        ("epochs=two", "epochs must be an integer"),
        ("seed=-1", "seed must be an integer >= 0 and < 4294967296"),
        ("seed=4294967296", "seed must be an integer >= 0 and < 4294967296"),
        ("device=tpu", "device must be auto, cpu or cuda"),
        ("framework=caffe", "invalid configuration"),
        ("framework=[1]", "framework takes the name of one of its configs"),
        ("dataset=3", "dataset takes the name of one of its configs"),
        ("dataset.files=0", "dataset.files must be a mapping of its keys"),
        ("data.train_limit=0", "data.train_limit must be an integer >= 1"),
        ("optimizer.lr=nan", "optimizer.lr must be a finite number"),
        ("run_name=a/b", "run_name must be a plain directory name"),
        ("epochs=", "epochs must be an integer"),
        ("output_dir=123", "output_dir must be a non-empty string"),
        ("data_dir=''", "data_dir must be a non-empty string"),
        ("log.progress=1", "log.progress must be auto, true or false"),
        ("data.drop_last=maybe", "data.drop_last must be true or false"),
        ("dataset.std=0", "dataset.std must be a finite number > 0"),
        ("dataset.num_classes=abc", "dataset.num_classes must be an integer >= 2"),
        ("dataset.files.train_images.bytes=abc", "dataset.files.train_images.bytes must be an integer >= 1"),
        ("dataset.files.test_labels.sha256=ABC", "dataset.files.test_labels.sha256 must be a sha256 hex digest"),
    ],
)
def test_bad_values_are_refused(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config([override])


def test_a_batch_smaller_than_the_tensorflow_towers_is_refused_by_the_config():
    """Every tower needs an example of each batch; refused in one line naming both keys, before TensorFlow
    is imported (the last batch of a training set, known only with the data, is the trainer's to check)."""
    with pytest.raises(ConfigError) as refused:
        load_config(["framework=tensorflow", "framework.towers=4", "batch_size=3"])
    [line] = str(refused.value).splitlines()
    assert line.startswith("framework.towers=4 needs at least 4 examples in every batch, and batch_size=3 holds 3")
    assert "batch_size>=4" in line and "framework.towers<=3" in line
    assert load_config(["framework=tensorflow", "framework.towers=3", "batch_size=3"]).batch_size == 3
    assert load_config(["framework=pytorch", "batch_size=1"]).batch_size == 1  # no towers there


@pytest.mark.process
def test_train_refuses_a_batch_smaller_than_the_towers_before_importing_tensorflow(tmp_path):
    code = (
        "import sys; from reprocube.cli import main; "
        f"status = main(['train', 'framework=tensorflow', 'batch_size=1', 'output_dir={tmp_path}']); "
        "print(status, 'tensorflow' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout == f"{EXIT_CONFIG} False\n", done.stderr
    [line] = done.stderr.splitlines()
    assert line.startswith("reprocube: error: framework.towers=2 needs at least 2 examples in every batch")


def test_number_types_are_normalised():
    integer, real = (
        load_config(["optimizer.momentum=0", "optimizer.lr=1"]),
        load_config(["optimizer.momentum=0.0", "optimizer.lr=1.0"]),
    )
    assert config_hash(to_plain(integer)) == config_hash(to_plain(real))
    assert load_config(["run_name=123"]).run_name == "123"


def test_user_yaml_strings_survive_quoting(tmp_path):
    for name in ["a\\b", "it's", "end\\", "back\\'quote", 'dq"x', "sp ace"]:
        user = tmp_path / "train.yaml"
        user.write_text(yaml.safe_dump({"run_name": name}))
        assert load_config([], [str(user)]).run_name == name


def test_config_hash_ignores_places_cadences_and_epochs_only():
    base = to_plain(load_config([]))
    same = to_plain(
        load_config(
            [
                "epochs=9",
                "output_dir=/elsewhere",
                "run_name=x",
                "data_dir=/d",
                "resume=latest",
                "checkpoint.every_steps=5",
                "log.every_steps=1",
            ]
        )
    )
    assert config_hash(base) == config_hash(same)
    for override in ("seed=1", "threads=1", "optimizer.lr=0.02", "data.train_limit=10", "deterministic=false"):
        assert config_hash(to_plain(load_config([override]))) != config_hash(base), override


def test_tensorflow_inter_op_threads_are_not_a_result_key():
    def tensorflow(*overrides):
        return to_plain(load_config(["framework=tensorflow", *overrides]))

    assert config_hash(tensorflow("framework.inter_op_threads=2")) == config_hash(tensorflow())
    assert config_differences(tensorflow(), tensorflow("threads=1")) == ["threads: 2 -> 1"]  # intra-op: other bits
    # checkpoints and receipts written while it was a result key still match their recorded hash
    written_before = config_hash(tensorflow(), keep=FORMER_RESULT_KEYS)
    assert written_before != config_hash(tensorflow()) and config_hash_matches(tensorflow(), written_before)
    assert not config_hash_matches(tensorflow("threads=1"), written_before)


def test_pytorch_memory_format_is_a_result_key_read_as_contiguous_where_a_config_predates_it():
    default = to_plain(load_config([]))
    contiguous = to_plain(load_config(["framework.memory_format=contiguous"]))
    assert default["framework"]["memory_format"] == "channels_last"
    assert config_differences(contiguous, default) == ['framework.memory_format: "contiguous" -> "channels_last"']
    written_before = to_plain(load_config(["framework.memory_format=contiguous"]))
    del written_before["framework"]["memory_format"]  # a run or receipt made before the key existed
    assert config_differences(written_before, contiguous) == []
    assert config_differences(written_before, default) == config_differences(contiguous, default)
    # its recorded hash is of the config as written (nothing filled in), and still matches it
    assert config_hash(written_before) != config_hash(contiguous)
    assert config_hash_matches(written_before, config_hash(written_before))
    for other in ("tensorflow", "jax"):  # PyTorch's key only: the other trainers' configs are unchanged
        assert "memory_format" not in to_plain(load_config([f"framework={other}"]))["framework"]
    with pytest.raises(ConfigError, match="framework.memory_format must be channels_last or contiguous"):
        load_config(["framework.memory_format=nhwc"])


def test_jax_conv2_is_a_result_key_read_as_convolution_where_a_config_predates_it():
    default = to_plain(load_config(["framework=jax"]))
    former = to_plain(load_config(["framework=jax", "framework.conv2=convolution"]))
    assert default["framework"]["conv2"] == "matmul"
    assert config_differences(former, default) == ['framework.conv2: "convolution" -> "matmul"']
    del former["framework"]["conv2"]  # a run or receipt made before the key existed
    assert config_differences(former, default) == ['framework.conv2: "convolution" -> "matmul"']
    assert config_hash_matches(former, config_hash(former))
    with pytest.raises(ConfigError, match="framework.conv2 must be matmul or convolution"):
        load_config(["framework=jax", "framework.conv2=fft"])


def test_config_differences_name_the_keys():
    a = to_plain(load_config([]))
    b = to_plain(load_config(["seed=2", "optimizer.momentum=0.9", "epochs=10"]))
    assert config_differences(a, b) == ["optimizer.momentum: 0.5 -> 0.9", "seed: 0 -> 2"]
