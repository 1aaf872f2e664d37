"""A rewritten graph's forward with its module lookups done once: the code runs on the host at every
step, and torch.fx writes each module call as a chain of lookups from the root
(``getattr(self.net.layer1, "0").conv1(x)``: four ``nn.Module.__getattr__`` calls for one call).

:func:`flat_forward` compiles the graph once more with every module it calls or reads replaced by
an attribute of a small namespace (``_flat_3.__call__(x)``, the same ``nn.Module.__call__``, hooks
and all): the modules are looked up once, when the namespace is built; anything else the code reads
(tensors, constants) is read from the owner as the graph's own code reads it. On ResNet-50's graph
this saves about half a millisecond of host time per forward.

Only in plain eager mode, and only for an owner that refuses a replaced module at each call (the
wrapper's follow state): the code then never meets a module that is not the one it looked up.

References:
    PyTorch ``torch.fx.Graph.python_code`` (the code a ``GraphModule`` runs).
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import Any

import torch.fx as fx
from torch import nn

__all__ = ["flat_forward", "forget"]

_KEPT_MAX = 4  #: graphs kept per owner (a wrapper has two: training and eval)


class _Namespace:
    """What a flat forward runs with as ``self``: each module the graph uses as a plain attribute;
    any other name read from the owner (held weakly: the owner keeps this namespace)."""

    def __init__(self, owner: nn.Module) -> None:
        self.__dict__["_owner"] = weakref.ref(owner)

    def __getattr__(self, name: str) -> Any:
        owner = self.__dict__["_owner"]()
        if owner is None:  # pragma: no cover - the owner holds the namespace
            raise AttributeError(name)
        return getattr(owner, name)


def _resolve(owner: nn.Module, target: str) -> Any:
    value: Any = owner
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _build(owner: nn.Module, graph: fx.Graph) -> tuple[Callable[..., Any], _Namespace]:
    namespace = _Namespace(owner)
    names: dict[str, str] = {}
    flat = fx.Graph()
    env: dict[fx.Node, fx.Node] = {}

    def module_ref(target: str) -> fx.Node:
        name = names.get(target)
        if name is None:
            name = names[target] = f"_flat_{len(names)}"
            namespace.__dict__[name] = _resolve(owner, target)
        return flat.get_attr(name)

    for node in graph.nodes:
        if node.op == "call_module":
            args = fx.map_arg(node.args, env.__getitem__)
            kwargs = fx.map_arg(node.kwargs, env.__getitem__)
            env[node] = flat.call_method("__call__", (module_ref(node.target), *args), kwargs)
        elif node.op == "get_attr" and isinstance(_resolve(owner, node.target), nn.Module):
            env[node] = module_ref(node.target)
        else:
            env[node] = flat.node_copy(node, env.__getitem__)
    code = flat.python_code(root_module="self")
    scope = dict(code.globals)
    exec(compile(code.src, f"<vispos flat graph of {type(owner).__name__}>", "exec"), scope)  # noqa: S102
    return scope["forward"], namespace


def flat_forward(owner: nn.Module, graph: fx.Graph) -> tuple[Callable[..., Any], _Namespace]:
    """``(forward, namespace)``: ``forward(namespace, *inputs)`` runs ``graph`` (code written for a
    root module ``owner``) with the modules it uses looked up once. Kept in ``owner.__dict__``
    per graph (a wrapper switches graphs with its mode; a few kept) and for ``owner``'s own
    children dict (a replica or a copy of ``__dict__`` builds its own); dropped from its pickled
    or copied state and by :func:`forget` (a wrapper that records its network anew).

    Raises:
        AttributeError: a module path of the graph that ``owner`` does not have.
    """
    kept = owner.__dict__.get("_flat_graphs")
    # built for this owner and these children: a replica (DataParallel copies __dict__, children
    # swapped for its own) or a dict copied by hand builds its own
    if kept is None or kept.get("owner") is not owner._modules:
        kept = owner.__dict__["_flat_graphs"] = {"owner": owner._modules}
    entry = kept.get(id(graph))
    if entry is None or entry[0] is not graph:
        if len(kept) > _KEPT_MAX:  # graphs swapped in by hand: keep a few
            kept = owner.__dict__["_flat_graphs"] = {"owner": owner._modules}
        entry = kept[id(graph)] = (graph, *_build(owner, graph))
    return entry[1], entry[2]


def forget(owner: nn.Module) -> None:
    """Drops what :func:`flat_forward` kept for ``owner``: its next call looks its modules up again
    (after ``follow()`` accepted the network as it is now).

    Raises:
        Nothing.
    """
    owner.__dict__.pop("_flat_graphs", None)
