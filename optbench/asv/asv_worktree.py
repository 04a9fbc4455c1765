"""asv's ``worktree`` environment: each commit from a git worktree, on an interpreter already here.

asv's ``existing`` environment measures only the code that is checked out, so ``asv run A..B``,
``asv run HEAD^!`` and ``asv continuous BASE HEAD`` refuse it. This environment (asv.conf.json
lists this module in ``plugins`` and names it as its ``environment_type``; ``-E worktree:<python>``
names another interpreter) checks
the code of each commit asv installs out into a detached git worktree,
``<env_dir>/worktrees/<commit>``, without its ``results/`` (:mod:`optbench.run.worktree`), and
runs asv's benchmark processes on the named interpreter (``same``, the default ``X.Y`` of asv's
own, a name on ``PATH`` or a path) with that worktree first on ``PYTHONPATH``. It creates no
virtualenv and installs nothing: the interpreter brings the dependencies (torch, asv_runner).

The benchmark processes also get asv's variables (``ASV=true``, ``ASV_COMMIT``: optbench stores
its records under that commit, ``optbench.run.runner.current_commit``) and, unless set,
``OPTBENCH_RESULTS``: the results root of asv.conf.json's ``results_dir`` (its parent, as
``optbench.store.store.asv_results_dir`` lays it out), so that optbench's records land beside asv's
and not in the worktree. ``ASV_PYTHONPATH`` (what asv's benchmark script puts first on its
``sys.path``) and ``PYTHONPATH`` are both the worktree, then the caller's ``ASV_PYTHONPATH`` where
set, else its ``PYTHONPATH``, less the repository's own work tree (which the worktree replaces).

asv imports the ``benchmarks`` package from asv.conf.json's ``benchmark_dir`` (the checkout asv
runs in), as it does for every environment: the benchmark definitions are the current ones, the
project code (``optbench``, ``models``, ``kernels``) is the commit's.

Worktrees are reused: a commit asv installs again (another round, another interpreter, a later
call) gets its worktree back, reset to the commit. The :data:`KEEP_WORKTREES` used last are kept,
older ones removed (``git worktree remove``). The repository must be a local git repository
(asv.conf.json's ``repo``); the matrix of requirements is ignored, as ``existing`` ignores it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

from asv import util
from asv.console import log
from asv.environment import Environment, EnvironmentUnavailable, get_env_name
from asv.plugins.git import Git

from optbench.run import worktree

# How many worktrees stay on disk: those of ``asv continuous``'s two commits and a few more, so
# that interleaved rounds and repeated calls reuse them, while ``asv run A..B`` over many commits
# does not fill the disk (one worktree is a whole checkout).
KEEP_WORKTREES = 4
WORKTREES_DIR = "worktrees"  # inside asv.conf.json's env_dir


def resolve_python(spec: str) -> str:
    """The interpreter a python specifier names: ``same`` or asv's own ``X.Y``: asv's interpreter;
    another ``X.Y``: ``pythonX.Y`` on ``PATH``; else a name on ``PATH`` or a path. Absolute, links
    kept (a virtualenv's python is a link). Raises :class:`OSError` where there is none."""
    own = f"{sys.version_info[0]}.{sys.version_info[1]}"
    if spec in ("same", own):
        return sys.executable
    name = f"python{spec}" if re.fullmatch(r"\d+\.\d+", spec) else spec
    return os.path.abspath(util.which(name))


def python_version(executable: str) -> str:
    """``X.Y`` of the interpreter ``executable`` (asv's own without starting it); raises
    :class:`asv.util.ProcessError` where it does not run."""
    if executable == sys.executable:
        return f"{sys.version_info[0]}.{sys.version_info[1]}"
    return util.check_output(
        [executable, "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], dots=False
    ).strip()


def python_path(worktree: Path, inherited: str | None, repo: Path) -> str:
    """``PYTHONPATH`` of a benchmark process: ``worktree`` first, then the entries of ``inherited``
    but the repository's own work tree ``repo``."""
    kept = [
        p for p in (inherited or "").split(os.pathsep) if p and Path(p).resolve() != repo.resolve()
    ]
    return os.pathsep.join([str(worktree), *kept])


class WorktreeEnvironment(Environment):
    """An asv environment that runs each commit from a git worktree on an existing interpreter."""

    tool_name = "worktree"
    matches_python_fallback = False

    def __init__(
        self,
        conf: Any,
        python: str,
        requirements: dict[str, str],
        tagged_env_vars: dict[tuple[str, str], str],
    ) -> None:
        try:
            self._executable = resolve_python(python)
            self._version = python_version(self._executable)
        except (OSError, util.ProcessError) as exc:
            raise EnvironmentUnavailable(f"worktree: no python {python!r}: {exc}") from exc
        self._repo = Path(conf.repo).resolve()
        self._worktrees = Path(conf.env_dir).resolve() / WORKTREES_DIR
        self._results_root = Path(conf.results_dir).resolve().parent
        self._requirements: dict[str, str] = {}  # dir_name reads it inside Environment.__init__
        super().__init__(conf, self._executable, {}, tagged_env_vars)

    @classmethod
    def matches(cls, python: str) -> bool:
        try:
            resolve_python(python)
        except OSError:
            return False
        return True

    @property
    def name(self) -> str:
        """asv's name of this environment, which its results files carry and by which ``asv
        compare`` pairs results: ``worktree-py<X.Y>``, the interpreter's version, the same in every
        clone and virtualenv (a path would make each clone's results an environment of its own)."""
        return get_env_name(self.tool_name, self._version, {}, self._tagged_env_vars)

    def check_presence(self) -> bool:
        return os.path.isdir(self._path)

    def _setup(self) -> None:
        """Only the folder of asv's bookkeeping files: nothing is built or installed."""
        os.makedirs(self._path, exist_ok=True)

    def can_install_project(self) -> bool:
        return True

    def install_project(self, conf: Any, repo: Any, commit_hash: str) -> None:
        """Checks ``commit_hash`` out into its worktree (reused where it exists), removes the
        least recently used worktrees beyond :data:`KEEP_WORKTREES`, and records the commit as
        installed."""
        if not Git.is_local_repo(str(self._repo)):
            raise util.UserError(f"worktree: {self._repo} is not a local git repository")
        self._set_installed_commit_hash(None)
        tree = self.worktree(commit_hash)
        self._prune(keep=tree)
        self._set_commit_hash(commit_hash)
        self._set_build_dirs(str(tree), None)
        self._set_installed_commit_hash(commit_hash)

    def worktree(self, commit_hash: str) -> Path:
        """The worktree of ``commit_hash``, checked out at that commit with no local changes: the
        existing one, else a new one; marked as just used."""
        tree = self._worktrees / commit_hash
        if (tree / ".git").exists():
            try:
                worktree.switch(tree, commit_hash)
            except subprocess.CalledProcessError:
                worktree.remove(tree, self._repo)
        if not (tree / ".git").exists():
            self._worktrees.mkdir(parents=True, exist_ok=True)
            try:
                worktree.add(tree, commit_hash, self._repo)
            except subprocess.CalledProcessError as exc:
                raise util.UserError(f"worktree: {commit_hash}: {exc.stderr.strip()}") from exc
        os.utime(tree)
        return tree

    def _prune(self, keep: Path) -> None:
        """Removes the least recently used worktrees beyond :data:`KEEP_WORKTREES`, never
        ``keep``."""
        trees = sorted(
            (p for p in self._worktrees.iterdir() if p.is_dir() and p != keep),
            key=lambda p: p.stat().st_mtime,
            reverse=True,
        )
        for tree in trees[KEEP_WORKTREES - 1 :]:
            worktree.remove(tree, self._repo)

    def run(self, args: list[str], **kwargs: Any) -> Any:
        """Runs this environment's interpreter with ``args`` on the worktree of the installed
        commit (the module's docstring says what its environment holds)."""
        commit = self._get_installed_commit_hash()
        if commit is None:
            raise util.UserError(f"worktree: no commit installed in {self.name}")
        tree = self._worktrees / commit
        if not (tree / ".git").exists():  # removed since asv installed it (another asv call)
            tree = self.worktree(commit)
        env = dict(kwargs.pop("env", None) or os.environ)
        env.update(self._global_env_vars)
        path = python_path(tree, env.get("ASV_PYTHONPATH", env.get("PYTHONPATH")), self._repo)
        # asv's benchmark script drops PYTHONPATH's entries from its sys.path and puts those of
        # ASV_PYTHONPATH first; the processes a benchmark starts (torchrun's) read PYTHONPATH.
        env.update(ASV_COMMIT=commit, ASV_BUILD_DIR=str(tree), ASV_PYTHONPATH=path, PYTHONPATH=path)
        env.setdefault("OPTBENCH_RESULTS", str(self._results_root))
        log.debug(f"Running '{' '.join(args)}' in {self.name} at {commit[:8]}")
        return util.check_output([self._executable, *args], env=env, **kwargs)
