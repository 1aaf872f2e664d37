"""What a wrapped model looked like when it was made padding invariant, checked at every call, so
that a change made to the model afterwards is refused by name instead of run silently wrong.

A graph rewritten for padding invariance decides, once, where zeros are written into each map's
padding and which layer reads what; a hook registered afterwards (it may change a value after the
fill was written), a submodule replaced (the graph calls the new module with the old module's
rule, or the wrapper keeps calling the old one), or a module whose own traced code branches on
``self.training`` put in another mode than the model (each mode's graph holds that module's code
of its mode) would each make the output silently wrong. :class:`ModelState` records, when the
wrapper is built, every parent-to-child link of the model's module tree, the hooks of every
module and torch's global module hooks, and the modules whose traced code differs between the
training and the eval graph; :meth:`ModelState.changed` compares them at each call (a few
microseconds for a ResNet-18: one pass over the links, one truthiness test per hook table) and
says what changed.

References:
    torch.nn ``Module`` (``_forward_hooks``, ``_forward_pre_hooks``, ``_backward_hooks``,
    ``_backward_pre_hooks``; ``register_module_forward_hook`` and the other global hooks; hook
    handle ids only grow); torch.fx (``Graph``, ``Node.meta``).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import torch.fx as fx
from torch import nn
from torch.nn.modules import module as _module

__all__ = ["ModelState", "mode_dependent"]

#: a module's hook tables, read at each call
_HOOK_TABLES = ("_forward_pre_hooks", "_forward_hooks", "_backward_pre_hooks", "_backward_hooks")
#: torch's global module hooks (``torch.nn.modules.module.register_module_*_hook``)
_GLOBAL_TABLES = ("_global_forward_pre_hooks", "_global_forward_hooks", "_global_backward_pre_hooks",
                  "_global_backward_hooks")


def _table_state(table: dict) -> tuple[int, Any] | None:
    """A hook table's state: its size and newest handle id (ids only grow, so a hook removed and
    another added changes it too); None when empty."""
    return (len(table), next(reversed(table))) if table else None


def _hooks_state(module: nn.Module) -> tuple[Any, ...] | None:
    states = tuple(_table_state(getattr(module, name)) for name in _HOOK_TABLES)
    return None if states == (None,) * len(_HOOK_TABLES) else states


def _global_state() -> tuple[Any, ...]:
    return tuple(_table_state(getattr(_module, name, {})) for name in _GLOBAL_TABLES)


def _own_code(graph: fx.Graph) -> dict[str, list[Any]]:
    """Per module path: the calls traced in that module's own code, with their constants."""
    code: dict[str, list[Any]] = defaultdict(list)
    for node in graph.nodes:
        if node.op in ("call_module", "call_function", "call_method"):
            constants = fx.node.map_arg((node.args, node.kwargs), lambda n: None)
            code[node.meta.get("vispos_path", "")].append((node.op, str(node.target), repr(constants)))
    return code


def mode_dependent(train_graph: fx.Graph, eval_graph: fx.Graph) -> list[str]:
    """The paths of the modules whose own traced code differs between the training and the eval
    graph (their forward branches on ``self.training``: timm's ``DropPath``, a training-only
    branch), the model itself (``""``) excepted, sorted."""
    train, evaluation = _own_code(train_graph), _own_code(eval_graph)
    return sorted(p for p in set(train) | set(evaluation) if p and train.get(p) != evaluation.get(p))


class ModelState:
    """A model's module tree, hooks and mode-dependent modules as they were when it was wrapped.

    Args:
        model (nn.Module): the wrapped model (its modules are shared with the wrapper).
        mode_paths (sequence of str): the modules (paths under ``model``) whose traced code
            differs between the modes (:func:`mode_dependent`).
    """

    def __init__(self, model: nn.Module, mode_paths: Any = ()) -> None:
        links, stack, seen = [], [("", model)], {id(model)}
        while stack:  # every parent -> child link, parents first; a module shared by two parents once
            path, parent = stack.pop()
            for name, child in parent._modules.items():
                child_path = f"{path}.{name}" if path else name
                links.append((parent._modules, name, child, child_path))
                if child is not None and id(child) not in seen:
                    seen.add(id(child))
                    stack.append((child_path, child))
        self.model = model
        self.links = links
        unique = {id(m): (p, m) for _, _, m, p in reversed(links) if m is not None}  # each module once
        self.modules = list(unique.values()) + [("", model)]
        self.hooks = [_hooks_state(m) for _, m in self.modules]  # aligned with modules (ids change in a copy)
        self.global_hooks = _global_state()
        self.mode_modules = [(p, model.get_submodule(p)) for p in mode_paths]
        self._index()

    def _index(self) -> None:
        """The fast views :meth:`changed` reads: each parent's children as they were, the hook
        tables of the modules that had no hook (all empty then), the modules that had one."""
        parents: dict[int, tuple[dict, list]] = {}
        for table, _, child, _ in self.links:
            parents.setdefault(id(table), (table, []))[1].append(child)
        self._children = [(table, tuple(children)) for table, children in parents.values()]
        self._empty = [getattr(m, t) for (_, m), h in zip(self.modules, self.hooks) if h is None for t in _HOOK_TABLES]
        self._hooked = [(p, m, h) for (p, m), h in zip(self.modules, self.hooks) if h is not None]

    def also_follow(self, holder: nn.Module) -> None:
        """Also checks ``holder``'s own children (a wrapper that holds the model's children under
        the same names): each must stay the module it holds now."""
        if holder._modules is not self.model._modules:
            self.links.extend((holder._modules, name, child, name) for name, child in holder._modules.items())
        self._index()

    def _replaced(self) -> str:
        return _replaced_message(self.links)

    def changed(self, training: bool) -> str | None:
        """What changed since the model was wrapped, in words naming the module; None if nothing.

        Args:
            training (bool): the mode the wrapper runs in (its graph's mode).
        """
        if any(tuple(table.values()) != children for table, children in self._children):
            return self._replaced()
        if any(self._empty) or any(_hooks_state(m) != h for _, m, h in self._hooked):
            for (path, module), before in zip(self.modules, self.hooks):
                if _hooks_state(module) != before:
                    where = f"{path} ({type(module).__name__})" if path else f"the model ({type(module).__name__})"
                    return f"hooks were registered on or removed from {where}"
        if _global_state() != self.global_hooks:
            return "torch's global module hooks (torch.nn.modules.module.register_module_*_hook) changed"
        for path, module in self.mode_modules:
            if module.training != training:
                return (f"{path} ({type(module).__name__}) is in {'training' if module.training else 'eval'} mode "
                        f"while the model runs in {'training' if training else 'eval'} mode, and its forward "
                        "branches on self.training (each mode's graph holds its code of that mode): put it in the "
                        "model's mode")
        return None


_MISSING = object()


def _replaced_message(links: list) -> str | None:
    for table, name, child, path in links:
        now = table.get(name, _MISSING)
        if now is not child:
            if now is _MISSING:
                return f"its submodule {path} ({type(child).__name__}) was removed"
            return (f"its submodule {path} was replaced (a {type(now).__name__} where it was wrapped with a "
                    f"{type(child).__name__})")
    return "a submodule was added to a module it wraps"
