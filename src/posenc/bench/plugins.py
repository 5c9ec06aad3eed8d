"""The bench's tasks and schemes by name, and plugin files that add to them.

A *task* is any object with

* ``name``: a str, the name configurations and ``--tasks`` use;
* ``vocab``: a tuple of distinct token strings; id 0 is padding and id 1 the start
  token that begins every problem;
* ``sample(lengths, generator)``: for each problem length in ``lengths`` (a 1-D int
  array), one problem drawn with ``generator`` (a ``numpy.random.Generator``), as
  ``(tokens, scored)``: a 1-D int array of token ids and a bool array of the same length,
  True at the tokens the model is scored on (never the first);
* optionally ``max_positions(length)``: the longest problem of that length, in tokens
  (without it the bench measures the problems it draws).

A task whose ``sample`` also takes ``split="train"`` / ``split="eval"`` draws training
and evaluation problems from different sources (the built-in lm task: two parts of a
text). The built-in tasks (:mod:`posenc.bench.tasks`) are written this way.

A *scheme* is a name and a factory: ``factory(d_model=..., n_heads=..., head_dim=...,
max_positions=...)`` returns a module playing one of the attention protocol's roles
(:mod:`posenc.torch.protocols`): an input encoding (``InputEncoding``, applied once to
the embeddings), a rotation of queries and keys (``QueryKeyRotation``) or a bias on the
scores (``ScoreBias``); for the last two the model calls the factory once per layer.

:func:`register_task` and :func:`register_scheme` add to the registries of this process.
A worker process starts with the built-ins only: what it needs comes from the plugin
files (:func:`load_plugin`, ``posenc bench --plugin FILE.py``), which every worker loads
again, and from the objects registered here outside a plugin file, which are pickled to
the workers. This module does not import PyTorch.
"""

from __future__ import annotations

import hashlib
import inspect
import os
import pickle
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from .._checks import describe

__all__ = [
    "BUILTIN_TASKS",
    "load_plugin",
    "loaded_plugins",
    "register_scheme",
    "register_task",
    "registered_scheme",
    "registered_task",
    "scheme_names",
    "task_names",
]

#: The built-in tasks (:mod:`posenc.bench.tasks`).
BUILTIN_TASKS = ("copy", "reverse", "sort", "add", "passkey", "lm")

_TASKS: dict[str, Any] = {}  # registered tasks by name (not the built-ins)
_SCHEMES: dict[str, Callable[..., Any]] = {}  # registered scheme factories by name
_FROM_PLUGIN: set[tuple[str, str]] = set()  # ("task" | "scheme", name) made by a plugin
_PLUGINS: list[tuple[str, str]] = []  # (absolute path, source) loaded in this process
_LOADING: list[str] = []  # the plugin file being loaded (its registrations are marked)


def _builtin_schemes() -> tuple[str, ...]:
    from posenc.schemes import bench_schemes

    return bench_schemes()


def task_names() -> tuple[str, ...]:
    """The built-in tasks, then the registered ones in the order they were registered.

    Example:
        >>> task_names()[:6]
        ('copy', 'reverse', 'sort', 'add', 'passkey', 'lm')
    """
    return (*BUILTIN_TASKS, *_TASKS)


def scheme_names() -> tuple[str, ...]:
    """The built-in schemes, then the registered ones in the order they were registered.

    Example:
        >>> scheme_names()[:4]
        ('nope', 'learned', 'sinusoidal', 'rope')
    """
    return (*_builtin_schemes(), *_SCHEMES)


def registered_task(name: str) -> Any | None:
    """The task registered as ``name``, or None (a built-in or an unknown name)."""
    return _TASKS.get(name)


def registered_scheme(name: str) -> Callable[..., Any] | None:
    """The factory registered as ``name``, or None (a built-in or an unknown name)."""
    return _SCHEMES.get(name)


def _check_name(name: Any, kind: str, builtins: tuple[str, ...]) -> str:
    if not isinstance(name, str) or not name.strip() or name != name.strip():
        raise ValueError(
            f"a {kind}'s name must be a non-empty str without surrounding spaces, got "
            f"{describe(name)}"
        )
    if name in builtins:
        raise ValueError(f"{kind} {name!r} is built in; register yours under another name")
    return name


def check_task(task: Any) -> Any:
    """``task`` if it has what a task needs (module docstring), else a TypeError or a
    ValueError that says what is missing."""
    name = getattr(task, "name", None)
    if not isinstance(name, str):
        raise TypeError(f"a task needs a str attribute 'name', got {describe(task)}")
    vocab = getattr(task, "vocab", None)
    if not isinstance(vocab, tuple) or not all(isinstance(t, str) for t in vocab):
        raise TypeError(f"task {name!r}: vocab must be a tuple of token strings, got {vocab!r}")
    if len(vocab) < 3 or len(set(vocab)) != len(vocab):
        raise ValueError(
            f"task {name!r}: vocab must hold distinct tokens, padding (id 0), the start token "
            f"(id 1) and at least one more, got {vocab!r}"
        )
    if not callable(getattr(task, "sample", None)):
        raise TypeError(f"task {name!r} needs a method sample(lengths, generator)")
    limit = getattr(task, "max_positions", None)
    if limit is not None and not callable(limit):
        raise TypeError(f"task {name!r}: max_positions must be a method max_positions(length)")
    return task


def register_task(task: Any, *, replace: bool = False) -> Any:
    """Add ``task`` to the bench's tasks, under ``task.name``.

    Args:
        task: An object with ``name``, ``vocab``, ``sample`` and optionally
            ``max_positions`` (module docstring).
        replace: Let it replace a registered task of the same name (never a built-in).

    Returns:
        ``task``, so that a class's instance can be registered where it is made.

    Raises:
        TypeError: ``task`` lacks what a task needs.
        ValueError: Its name is a built-in task's, or already registered.

    Example:
        >>> import numpy as np
        >>> class Echo:  # [BOS] x [SEP] x: repeat one symbol
        ...     name, vocab = "echo-doc", ("<pad>", "<bos>", "<sep>", "a", "b")
        ...     def sample(self, lengths, generator):
        ...         out = []
        ...         for n in lengths:
        ...             x = generator.integers(3, 5, size=1)
        ...             out.append((np.array([1, *x, 2, *x]), np.array([0, 0, 0, 1], bool)))
        ...         return out
        >>> register_task(Echo()).name in task_names()
        True
    """
    check_task(task)
    name = _check_name(task.name, "task", BUILTIN_TASKS)
    if name in _TASKS and not replace and _TASKS[name] is not task:
        raise ValueError(f"task {name!r} is already registered (replace=True replaces it)")
    _TASKS[name] = task
    _mark("task", name)
    return task


def register_scheme(name: str, factory: Callable[..., Any], *, replace: bool = False) -> Any:
    """Add a positional scheme to the bench, built by ``factory`` (module docstring).

    Args:
        name: The name configurations and ``--schemes`` use.
        factory: Called as ``factory(d_model=, n_heads=, head_dim=, max_positions=)``;
            returns an ``nn.Module`` playing one of the attention protocol's roles.
        replace: Let it replace a registered scheme of the same name (never a built-in).

    Returns:
        ``factory`` (so that this works as a decorator with ``functools.partial``).

    Raises:
        TypeError: ``factory`` is not callable.
        ValueError: The name is a built-in scheme's, or already registered.

    Example:
        >>> def halve_keys(**sizes):  # an input encoding that changes nothing
        ...     from posenc.torch import NoPositionalEncoding
        ...     return NoPositionalEncoding(sizes["d_model"])
        >>> register_scheme("plain-doc", halve_keys) is halve_keys
        True
    """
    name = _check_name(name, "scheme", _builtin_schemes())
    if not callable(factory):
        raise TypeError(f"scheme {name!r}: factory must be callable, got {describe(factory)}")
    if name in _SCHEMES and not replace and _SCHEMES[name] is not factory:
        raise ValueError(f"scheme {name!r} is already registered (replace=True replaces it)")
    _SCHEMES[name] = factory
    _mark("scheme", name)
    return factory


def _mark(kind: str, name: str) -> None:
    """Remember whether a registration comes from a plugin file (which workers load
    again) or not (then it is pickled to them), the latest registration deciding."""
    if _LOADING:
        _FROM_PLUGIN.add((kind, name))
    else:
        _FROM_PLUGIN.discard((kind, name))


def load_plugin(path: str | os.PathLike[str]) -> ModuleType:
    """Import the Python file at ``path``, which registers tasks or schemes.

    The file is imported once per process under a module name made from its absolute
    path (so that its classes pickle by reference, also in worker processes, which load
    the same files before their first run); loading it again returns that module.

    Raises:
        FileNotFoundError: No file at ``path``.
        ValueError: ``path`` is not a ``.py`` file.
        ImportError: The file raised while it was imported (the error is chained).

    Example:
        >>> import pathlib, tempfile
        >>> with tempfile.TemporaryDirectory() as folder:
        ...     file = pathlib.Path(folder, "mine.py")
        ...     _ = file.write_text("from posenc.bench import register_scheme\\n"
        ...                         "from posenc.torch import NoPositionalEncoding\\n"
        ...                         "register_scheme('nothing-doc', lambda **sizes: "
        ...                         "NoPositionalEncoding(sizes['d_model']))\\n")
        ...     _ = load_plugin(file)
        >>> "nothing-doc" in scheme_names()
        True
    """
    if not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"a plugin is the path of a Python file, got {describe(path)}")
    file = Path(path).resolve()
    if not file.is_file():
        raise FileNotFoundError(f"plugin {os.fspath(path)!r}: no such file")
    if file.suffix != ".py":
        raise ValueError(f"plugin {os.fspath(path)!r} must be a Python file (.py)")
    return _load_source(str(file), file.read_text(encoding="utf-8"), os.fspath(path))


def _module_name(file: str) -> str:
    digest = hashlib.sha1(file.encode("utf-8")).hexdigest()[:12]
    return f"posenc_bench_plugin_{Path(file).stem}_{digest}"


def _load_source(file: str, source: str, shown: str) -> ModuleType:
    """Run a plugin's ``source`` as the module named after its absolute path ``file``
    (once per process), marking what it registers as coming from a plugin."""
    module_name = _module_name(file)
    if module_name in sys.modules:
        return sys.modules[module_name]
    module = ModuleType(module_name)
    module.__file__ = file
    sys.modules[module_name] = module
    _LOADING.append(file)
    before = dict(_TASKS), dict(_SCHEMES), set(_FROM_PLUGIN)
    try:
        exec(compile(source, file, "exec"), module.__dict__)  # the user's plugin: meant to run
    except Exception as exc:  # undo what it registered before it failed
        del sys.modules[module_name]
        _TASKS.clear()
        _TASKS.update(before[0])
        _SCHEMES.clear()
        _SCHEMES.update(before[1])
        _FROM_PLUGIN.clear()
        _FROM_PLUGIN.update(before[2])
        raise ImportError(f"plugin {shown!r} failed: {exc}") from exc
    finally:
        _LOADING.pop()
    _PLUGINS.append((file, source))
    return module


def loaded_plugins() -> tuple[str, ...]:
    """The absolute paths of the plugin files loaded in this process, in order."""
    return tuple(file for file, _ in _PLUGINS)


#: What a worker process needs to see the bench process's registries: the plugin files
#: (absolute path and source) and the other registrations, pickled.
WorkerState = tuple[tuple[tuple[str, str], ...], bytes]


def worker_state(tasks: Any = None, schemes: Any = None) -> WorkerState:
    """What a worker process needs to see this process's registries: the plugin files,
    with their sources (a worker on another machine may not have the file), and the
    registrations made outside them, pickled (to be unpickled once the plugins, whose
    classes they may use, are loaded): those of the names ``tasks`` and ``schemes``
    (default: all).

    Raises:
        ValueError: A registration made outside a plugin file does not pickle (a class
            defined inside a function, a lambda): the message names it.
    """
    wanted_tasks = set(_TASKS) if tasks is None else set(tasks)
    wanted_schemes = set(_SCHEMES) if schemes is None else set(schemes)
    tasks = {n: t for n, t in _TASKS.items()
             if n in wanted_tasks and ("task", n) not in _FROM_PLUGIN}  # fmt: skip
    schemes = {n: f for n, f in _SCHEMES.items()
               if n in wanted_schemes and ("scheme", n) not in _FROM_PLUGIN}  # fmt: skip
    for kind, objects in (("task", tasks), ("scheme", schemes)):
        for name, value in objects.items():
            try:
                pickle.dumps(value)
            except Exception as exc:
                raise ValueError(
                    f"{kind} {name!r} cannot be sent to worker processes ({exc}); define it "
                    "in a plugin file (posenc bench --plugin FILE.py) or an importable "
                    "module, or run with one job"
                ) from None
    return tuple(_PLUGINS), pickle.dumps((tasks, schemes))


def restore_worker_state(state: WorkerState) -> None:
    """In a worker: load the plugins (from their sources, under the module names the
    bench process gave them), then the other registrations of :func:`worker_state`."""
    plugins, registrations = state
    for file, source in plugins:
        _load_source(file, source, file)
    tasks, schemes = pickle.loads(registrations)
    for task in tasks.values():
        register_task(task, replace=True)
    for name, factory in schemes.items():
        register_scheme(name, factory, replace=True)


def accepts_split(task: Any) -> bool:
    """Whether ``task.sample`` takes a ``split`` keyword (train and eval problems differ)."""
    try:
        parameters = inspect.signature(task.sample).parameters
    except (TypeError, ValueError):
        return False
    return "split" in parameters or any(
        p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()
    )
