"""mlcube 0.0.9 without a shell (issue 15).

mlcube 0.0.9 runs `docker` and `singularity` through os.system on a command line joined with spaces
(mlcube.shell.Shell.run). A task parameter such as `runs_dir=/x$(touch pwned)` on the `mlcube run` command
line then runs on the host, and a path with a space becomes two arguments. This module, installed into the
MLCube launcher's venv (a .pth file imports it when the interpreter starts), replaces that path:

- DockerRun.configure/run and SingularityRun.configure/run build an argv list, one element per argument,
  and run it with subprocess (no shell). Paths (mounts, image files, task arguments) are elements as they
  are, whatever they hold.
- The free-form strings of the configuration (docker: docker, cpu_args, gpu_args, build_args, env_args;
  singularity: singularity, run_args, build_args; a task's entrypoint) are split into words as a POSIX
  shell would split them (blanks, '...' and "..." quotes) with exactly two expansions: `$(id -u)` and
  `$(id -g)` become the invoking user's effective uid and gid (mlcube.yaml's `--user=$(id -u):$(id -g)`).
  Anything else a shell would interpret ($, `, \\, ;, &, |, <, >, (, ), {, }, *, ?, [, ], a leading # or ~)
  is refused, as is a host path that --volume/--bind would split (':' and, for singularity, ','), and an
  image or file argument that would read as an option (leading '-').
- env_args and build_args values (KEY: VALUE in mlcube.yaml) reach docker literally, as one argument each
  (no $VAR expansion).
- A refusal is one line on stderr, `mlcube: error: ...`, and exit status 2, before anything runs or is
  created.
- Shell.run itself (any other caller) splits the same way and never starts a shell.
- Beside that: Apptainer's version string ("apptainer version 1.4.5") is understood, where spython 0.2.1
  logged a traceback for it on every singularity command.

Install: `VENV/bin/python scripts/reprocube_mlcube_noshell.py --install` (the Makefile's .venv-mlcube rule does it):
copies this file into the venv's site-packages with reprocube_mlcube_noshell.pth, then checks, in a fresh
interpreter, that the patch is active. The patch targets mlcube, mlcube-docker and mlcube-singularity
0.0.9 exactly: with any other version the patched commands refuse to run.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import os
import shlex
import signal
import subprocess
import sys
import typing as t
from pathlib import Path

VERSIONS = {"mlcube": "0.0.9", "mlcube-docker": "0.0.9", "mlcube-singularity": "0.0.9"}
PATCHED = "__reprocube_mlcube_noshell__"  # attribute set on every function this module installs

logger = logging.getLogger("reprocube_mlcube_noshell")


# ---- refusing and splitting ------------------------------------------------------------------------------


def refuse(message: str) -> t.NoReturn:
    """One line on stderr, exit status 2."""
    print(f"mlcube: error: {' '.join(message.split())}", file=sys.stderr, flush=True)
    sys.exit(2)


_UNSAFE = set("$`\\;&|<>(){}*?[]\n\r")
_UNSAFE_IN_DOUBLE_QUOTES = set("$`\\")


def _id_expansion(text: str, i: int) -> str | None:
    """The invoking user's id when text[i:] starts with exactly `$(id -u)` or `$(id -g)`."""
    if text.startswith("$(id -u)", i):
        return str(os.geteuid())
    if text.startswith("$(id -g)", i):
        return str(os.getegid())
    return None


def split_words(text: t.Any, what: str) -> list[str]:
    """`text` (a configuration string) split into words as a shell would, with `$(id -u)` and `$(id -g)`
    expanded; refused when a shell would do anything else with it."""
    if text is None:
        return []
    text = str(text)
    words: list[str] = []
    word: list[str] = []
    in_word = False
    i = 0

    def unsafe(char: str) -> t.NoReturn:
        refuse(
            f"{what} = {text!r}: {char!r} needs a shell and mlcube runs without one here (reprocube_mlcube_noshell); "
            "only blanks, '...' or \"...\" quotes, $(id -u) and $(id -g) are understood"
        )

    while i < len(text):
        char = text[i]
        if char in " \t":
            if in_word:
                words.append("".join(word))
                word, in_word = [], False
            i += 1
        elif char == "'":
            end = text.find("'", i + 1)
            if end < 0:
                unsafe("'")
            word.append(text[i + 1 : end])
            in_word, i = True, end + 1
        elif char == '"':
            end = text.find('"', i + 1)
            if end < 0:
                unsafe('"')
            j = i + 1
            while j < end:
                expansion = _id_expansion(text, j)
                if expansion is not None and j + 8 <= end:
                    word.append(expansion)
                    j += 8
                elif text[j] in _UNSAFE_IN_DOUBLE_QUOTES:
                    unsafe(text[j])
                else:
                    word.append(text[j])
                    j += 1
            in_word, i = True, end + 1
        else:
            expansion = _id_expansion(text, i)
            if expansion is not None:
                word.append(expansion)
                in_word, i = True, i + 8
                continue
            if char in _UNSAFE or (char in "#~" and not in_word):
                unsafe(char)
            word.append(char)
            in_word, i = True, i + 1
    if in_word:
        words.append("".join(word))
    return words


def single_word(value: t.Any, what: str) -> str:
    """An image, a file or a directory given as one argument: passed as it is, unless it reads as an option."""
    value = str(value)
    if not value or value.startswith("-"):
        refuse(f"{what} = {value!r}: would read as an option, not as a name")
    return value


def mount(host: str, inside: str, option: str, separators: str) -> str:
    for separator in separators:
        if separator in host:
            refuse(
                f"host path {host!r} holds {separator!r}, which {option} would split on; "
                "use a path without it (or a symbolic link to it)"
            )
    return f"{host}:{inside}"


def extra_args(runner: t.Any) -> list[str]:
    """The runner's `--key: value` options (--network, --gpus, ...), one argument each."""
    return [f"{key}={value}" for key, value in runner.items() if str(key).startswith("--") and value is not None]


# ---- running ----------------------------------------------------------------------------------------------


def run_argv(argv: list[str], on_error: str = "raise", cwd: str | None = None, devnull: bool = False) -> int:
    """Shell.run's contract (exit code; on_error raise|die|ignore) for an argv list, without a shell. Like
    os.system, mlcube itself ignores SIGINT/SIGQUIT while the command runs (Ctrl-C goes to the command)."""
    from mlcube.errors import ExecutionError

    if on_error not in ("raise", "die", "ignore"):
        raise ValueError(f"Unrecognized 'on_error' action ({on_error}). Valid options are ('raise', 'die', 'ignore').")
    cmd = shlex.join(argv)
    try:
        process = subprocess.Popen(argv, cwd=cwd, stdout=subprocess.DEVNULL if devnull else None)
    except OSError as exc:
        exit_code, exit_status = 127, "exited"
        logger.error("Command='%s' could not start: %s", cmd, exc)
    else:
        handlers = [(sig, signal.signal(sig, signal.SIG_IGN)) for sig in (signal.SIGINT, signal.SIGQUIT)]
        try:
            returncode = process.wait()
        finally:
            for sig, handler in handlers:
                signal.signal(sig, handler)
        exit_code, exit_status = (returncode, "exited") if returncode >= 0 else (returncode, "signalled")
    msg = f"Command='{cmd}' exit_status={exit_status} exit_code={exit_code} on_error={on_error}"
    if exit_code != 0:
        if not devnull:
            logger.error(msg)
        if on_error == "die":
            sys.exit(exit_code)
        if on_error == "raise":
            raise ExecutionError("Failed to execute shell command.", status=exit_status, code=exit_code, cmd=cmd)
    else:
        logger.info(msg)
    return exit_code


def _check_versions() -> None:
    from importlib.metadata import PackageNotFoundError, version

    for name, wanted in VERSIONS.items():
        try:
            found = version(name)
        except PackageNotFoundError:
            continue  # a runner that is not installed is never called
        if found != wanted:
            refuse(
                f"reprocube_mlcube_noshell is written for {name} {wanted} but {found} is installed; "
                "refusing to run (rebuild the launcher venv: make setup)"
            )


# ---- mlcube.shell -----------------------------------------------------------------------------------------


def shell_run(cmd: str | list, on_error: str = "raise") -> int:
    _check_versions()
    text = " ".join(str(part) for part in cmd) if isinstance(cmd, (list, tuple)) else str(cmd)
    argv = split_words(text, "command")
    if not argv:
        refuse("empty command")
    return run_argv(argv, on_error=on_error)


def docker_image_exists(docker: str | None, image: str) -> bool:
    _check_versions()
    argv = [
        *split_words(docker or "docker", "docker.docker"),
        "inspect",
        "--type=image",
        single_word(image, "docker.image"),
    ]
    return run_argv(argv, on_error="ignore", devnull=True) == 0


def to_cli_args(args: t.Mapping[str, t.Any], sep: str = "=", parent_arg: str | None = None) -> str:
    """As mlcube's, with each KEY=VALUE quoted, so that split_words gives it back as one word, literally."""
    parent = "" if not parent_arg else parent_arg + " "
    return " ".join(f"{parent}{shlex.quote(f'{k}{sep}{v}')}" for k, v in args.items())


def patch_shell(module) -> None:
    shell = module.Shell
    shell.run = staticmethod(_mark(shell_run))
    shell.docker_image_exists = staticmethod(_mark(docker_image_exists))
    shell.to_cli_args = staticmethod(_mark(to_cli_args))


# ---- mlcube_docker ----------------------------------------------------------------------------------------


def _words(value: t.Any, what: str) -> list[str]:
    """A free-form argument string, or a mapping that Config.validate has not turned into one yet."""
    if hasattr(value, "items"):
        return split_words(to_cli_args(value, parent_arg="-e" if what.endswith("env_args") else "--build-arg"), what)
    return split_words(value, what)


def _check_mounts(mlcube, task: str, option: str, separators: str) -> None:
    """Refuse a host path that cannot be mounted, before any directory is created."""
    from mlcube.errors import ConfigurationError
    from mlcube.shell import Shell

    try:
        mounts, _, _ = Shell.generate_mounts_and_args(mlcube, task, make_dirs=False)
    except ConfigurationError:
        return  # reported by the real pass, as mlcube reports it
    for host, inside in mounts.items():
        mount(host, inside, option, separators)


def docker_configure(self) -> None:
    _check_versions()
    from mlcube.errors import ExecutionError
    from mlcube_docker.docker_run import Config

    runner = self.mlcube.runner
    image = single_word(runner.image, "docker.image")
    context = os.path.abspath(os.path.join(self.mlcube.runtime.root, runner.build_context))
    recipe = os.path.abspath(os.path.join(context, runner.build_file))
    docker = split_words(runner.docker, "docker.docker")
    build_args = _words(runner.build_args, "docker.build_args")
    if runner.build_strategy == Config.BuildStrategy.PULL or not os.path.exists(recipe):
        logger.info("Will pull image (%s) (build_strategy=%s)", image, runner.build_strategy)
        try:
            run_argv([*docker, "pull", image])
        except ExecutionError as err:
            raise ExecutionError.mlcube_configure_error(
                self.__class__.__name__, f"Error occurred while pulling docker image (image={image}).", **err.context
            ) from err
    else:
        logger.info("Will build image (%s) (build_strategy=%s)", image, runner.build_strategy)
        try:
            run_argv([*docker, "build", *build_args, "-t", image, "-f", recipe, context])
        except ExecutionError as err:
            raise ExecutionError.mlcube_configure_error(
                self.__class__.__name__,
                f"Error occurred while building docker image (image={image}, recipe={recipe}, context={context}).",
                **err.context,
            ) from err


def docker_run(self) -> None:
    _check_versions()
    from mlcube.errors import ConfigurationError, ExecutionError
    from mlcube.shell import Shell
    from mlcube_docker.docker_run import Config

    runner = self.mlcube.runner
    # Everything is checked before anything runs or is created.
    docker = split_words(runner.docker, "docker.docker")
    image = single_word(runner.image, "docker.image")
    _words(runner.build_args, "docker.build_args")
    env_args = _words(runner.env_args, "docker.env_args")
    num_gpus = self.mlcube.get("platform", {}).get("accelerator_count", None) or 0
    run_args = split_words(
        runner.cpu_args if num_gpus == 0 else runner.gpu_args, "docker.cpu_args" if num_gpus == 0 else "docker.gpu_args"
    )
    run_args += extra_args(runner)
    entrypoint = self.mlcube.tasks[self.task].get("entrypoint", None)
    entry_words = split_words(entrypoint, f"tasks.{self.task}.entrypoint") if entrypoint is not None else None
    if entry_words is not None and not entry_words:
        refuse(f"tasks.{self.task}.entrypoint is empty")
    _check_mounts(self.mlcube, self.task, "docker --volume", ":")

    if runner.build_strategy == Config.BuildStrategy.ALWAYS or not Shell.docker_image_exists(runner.docker, image):
        logger.warning(
            "Docker image (%s) does not exist or build strategy is 'always'. Will run 'configure' phase.", image
        )
        self.configure()
    try:
        Shell.sync_workspace(self.mlcube, self.task)
    except Exception as err:
        raise ExecutionError.mlcube_run_error(
            self.__class__.__name__,
            f"Error occurred while syncing MLCube workspace (task={self.task}). Actual error is {type(err)}.",
            error=str(err),
        ) from err
    try:
        mounts, task_args, mounts_opts = Shell.generate_mounts_and_args(self.mlcube, self.task)
    except ConfigurationError as err:
        raise ExecutionError.mlcube_run_error(
            self.__class__.__name__,
            f"Error occurred while generating mount points for docker run command (task={self.task}).",
            error=str(err),
        ) from err
    volumes: list[str] = []
    for host, inside in mounts.items():
        spec = mount(host, inside, "docker --volume", ":")
        volumes += ["--volume", spec + (f":{mounts_opts[host]}" if host in mounts_opts else "")]
    logger.info("mounts=%s, task_args=%s", mounts, task_args)

    if entry_words is not None:
        run_args.append(f"--entrypoint={entry_words[0]}")
        task_args = task_args[1:]  # custom entrypoints get no task name (mlcube's contract)
        # mlcube 0.0.9 passes no task arguments to a one-word entrypoint; kept as it is (use two words).
        command = [*entry_words[1:], *task_args] if len(entry_words) > 1 else []
    else:
        command = task_args
    _run_task(
        self, [*docker, "run", *run_args, *env_args, *volumes, image, *command], f"image={image}, task_args={task_args}"
    )


def _run_task(runner, argv: list[str], what: str) -> None:
    """Run a task's container command; a failure becomes mlcube's own run error, as unpatched."""
    from mlcube.errors import ExecutionError

    try:
        run_argv(argv)
    except ExecutionError as err:
        raise ExecutionError.mlcube_run_error(
            runner.__class__.__name__, f"Error occurred while running MLCube task ({what}).", **err.context
        ) from err


def patch_docker(module) -> None:
    module.DockerRun.configure = _mark(docker_configure)
    module.DockerRun.run = _mark(docker_run)


# ---- mlcube_singularity -----------------------------------------------------------------------------------


def singularity_configure(self) -> None:
    _check_versions()
    from mlcube.errors import ExecutionError

    self.check_install(self.mlcube.runner.singularity)
    runner = self.mlcube.runner
    image_file = Path(runner.image_dir, runner.image)
    singularity = split_words(runner.singularity, "singularity.singularity")
    build_args = split_words(runner.build_args, "singularity.build_args")
    single_word(image_file, "singularity image file")
    if image_file.exists():
        logger.info("SingularityRun SIF exists (%s) - no need to run the configure step.", image_file)
        return
    image_file.parent.mkdir(parents=True, exist_ok=True)
    build_path = Path(self.mlcube.runtime.root)
    recipe = single_word(runner.build_file, "singularity.build_file")
    if not (recipe.startswith("docker://") or recipe.startswith("docker-archive:")):
        if not Path(build_path, recipe).exists():
            raise OSError(f"SIF recipe file does not exist (path={build_path}, file={recipe})")
    try:
        run_argv([*singularity, "build", *build_args, str(image_file), recipe], cwd=str(build_path))
    except ExecutionError as err:
        raise ExecutionError.mlcube_configure_error(
            self.__class__.__name__,
            "Error occurred while building SIF image. See context for more details.",
            **err.context,
        ) from err


def singularity_run(self) -> None:
    _check_versions()
    from mlcube.errors import ConfigurationError, ExecutionError
    from mlcube.shell import Shell

    runner = self.mlcube.runner
    image_file = Path(runner.image_dir) / runner.image
    # Everything is checked before anything runs or is created.
    singularity = split_words(runner.singularity, "singularity.singularity")
    split_words(runner.build_args, "singularity.build_args")
    single_word(image_file, "singularity image file")
    single_word(runner.build_file, "singularity.build_file")
    run_args = split_words(runner.run_args, "singularity.run_args") + extra_args(runner)
    entrypoint = self.mlcube.tasks[self.task].get("entrypoint", None)
    entry_words = split_words(entrypoint, f"tasks.{self.task}.entrypoint") if entrypoint else None
    _check_mounts(self.mlcube, self.task, "singularity --bind", ":,")

    if not image_file.exists():
        self.configure()
    else:
        self.check_install(runner.singularity)
    try:
        Shell.sync_workspace(self.mlcube, self.task)
    except Exception as err:
        raise ExecutionError.mlcube_run_error(
            self.__class__.__name__, "Error occurred while syncing MLCube workspace.", error=str(err)
        ) from err
    try:
        mounts, task_args, mounts_opts = Shell.generate_mounts_and_args(self.mlcube, self.task)
    except ConfigurationError as err:
        raise ExecutionError.mlcube_run_error(
            self.__class__.__name__,
            "Error occurred while generating mount points for singularity run command.",
            error=str(err),
        ) from err
    binds: list[str] = []
    for host, inside in mounts.items():
        spec = mount(host, inside, "singularity --bind", ":,")
        binds += ["--bind", spec + (f":{mounts_opts[host]}" if host in mounts_opts else "")]
    logger.info("mounts=%s, task_args=%s", mounts, task_args)
    if entry_words:
        argv = [*singularity, "exec", *run_args, *binds, str(image_file), *entry_words, *task_args[1:]]
    else:
        argv = [*singularity, "run", *run_args, *binds, str(image_file), *task_args]
    _run_task(self, argv, f"task={self.task}")


def singularity_version_info():
    """`singularity --version` as a semantic version. spython 0.2.1 knows only "singularity version X";
    Apptainer answers "apptainer version 1.4.5", and mlcube-singularity logged a traceback for it on every
    command (it goes on either way: the version only decides a warning about --fakeroot)."""
    import semver
    from spython.utils.terminal import get_singularity_version

    text = get_singularity_version()
    for prefix in ("singularity version ", "apptainer version "):
        text = text.removeprefix(prefix)
    return semver.VersionInfo.parse(text)


def patch_singularity(module) -> None:
    module.SingularityRun.configure = _mark(singularity_configure)
    module.SingularityRun.run = _mark(singularity_run)
    module.get_singularity_version_info = _mark(singularity_version_info)


# ---- installing the patch ---------------------------------------------------------------------------------

PATCHES = {
    "mlcube.shell": patch_shell,
    "mlcube_docker.docker_run": patch_docker,
    "mlcube_singularity.singularity_run": patch_singularity,
}


def _mark(function):
    setattr(function, PATCHED, True)
    return function


class _PatchingLoader(importlib.abc.Loader):
    def __init__(self, loader, patch):
        self._loader, self._patch = loader, patch

    def create_module(self, spec):
        return self._loader.create_module(spec)

    def exec_module(self, module):
        self._loader.exec_module(module)
        self._patch(module)

    def __getattr__(self, name):  # get_source, get_filename, ... (tracebacks)
        return getattr(self._loader, name)


class _PatchingFinder(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        patch = PATCHES.get(name)
        if patch is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _PatchingLoader(spec.loader, patch)
        return spec


def install() -> None:
    """Called by reprocube_mlcube_noshell.pth at interpreter start: patch the mlcube modules when they are imported."""
    if not any(isinstance(finder, _PatchingFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _PatchingFinder())
    for name, patch in PATCHES.items():
        if name in sys.modules:
            patch(sys.modules[name])


def check_active() -> None:
    """Exit non-zero unless every mlcube entry point that runs a command is this module's."""
    from mlcube.shell import Shell
    from mlcube_docker.docker_run import DockerRun
    from mlcube_singularity.singularity_run import SingularityRun

    functions = [
        Shell.run,
        Shell.docker_image_exists,
        Shell.to_cli_args,
        DockerRun.run,
        DockerRun.configure,
        SingularityRun.run,
        SingularityRun.configure,
    ]
    missing = [f.__qualname__ for f in functions if not getattr(f, PATCHED, False)]
    if missing:
        refuse(f"reprocube_mlcube_noshell is not active for: {', '.join(missing)}")
    _check_versions()


def _install_into_this_interpreter() -> None:
    import shutil
    import sysconfig

    site = Path(sysconfig.get_path("purelib"))
    shutil.copyfile(__file__, site / "reprocube_mlcube_noshell.py")
    (site / "reprocube_mlcube_noshell.pth").write_text(
        "import reprocube_mlcube_noshell; reprocube_mlcube_noshell.install()\n"
    )
    check = subprocess.run(
        [sys.executable, "-c", "import reprocube_mlcube_noshell; reprocube_mlcube_noshell.check_active()"]
    )
    if check.returncode != 0:
        sys.exit(check.returncode)
    print(f"reprocube_mlcube_noshell: installed into {site} (mlcube runs docker/singularity without a shell)")


if __name__ == "__main__":
    if sys.argv[1:] != ["--install"]:
        sys.exit("usage: VENV/bin/python scripts/reprocube_mlcube_noshell.py --install")
    _install_into_this_interpreter()
