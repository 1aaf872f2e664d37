"""The rule book of padding invariance as one object: :class:`RuleBook`, a table keyed by what a
node of the traced graph calls (a module class, a function such as ``F.conv2d`` or ``torch.cat``,
or a method name such as ``"permute"``) with the tracer's policy beside it, and the one global
book (:func:`default_rules`) that :func:`register_invariance_rule` and :func:`rule_for` act on.

The rewriter of :mod:`vispos.invariance.rewrite` only walks the graph and asks a book; a call
without an entry is refused by name, never run inexactly. The tracer asks the same book which
modules it keeps whole, which it traces through, which it runs as another function while it
traces, and what it patches meanwhile. The global book is built when :mod:`vispos.invariance` is
imported, with every built-in entry registered there, in one place
(:mod:`vispos.invariance.rules._builtin`; MONAI's rows by dotted class names, so importing vispos
never imports MONAI): a user's entry registered afterwards is never replaced.
:func:`~vispos.make_padding_invariant` takes another book (``rules=``) for one call:
``default_rules().copy()`` with a few entries of its own.

Example::

    import torch
    from torch import nn
    import vispos

    class Scale(nn.Module):  # reads one cell at a time
        def __init__(self):
            super().__init__()
            self.gain = nn.Parameter(torch.ones(1))

        def forward(self, x):
            return x * self.gain

    book = vispos.invariance.default_rules().copy().register(Scale, vispos.CellWise())
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), Scale())
    inv = vispos.make_padding_invariant(net, rules=book)

References:
    torch.ao.quantization ``backend_config`` (``BackendConfig``: one object holding every pattern's
    ``BackendPatternConfig``, keyed by module classes, functions and method names; the rewriter
    asks it); torchvision ``models/feature_extraction.py`` and timm ``register_notrace_module``
    (the caller names its leaf modules).
"""

from __future__ import annotations

import inspect
import threading
import types
from typing import Any, Callable, ContextManager, Iterator

import torch
from torch import nn

from ... import _deprecation
from ._rule import CellWise, InvarianceRule, PaddingAware, Refuse, RewriteStep

__all__ = [
    "CellWise", "InvarianceRule", "PaddingAware", "Refuse", "RewriteStep", "RuleBook", "as_book", "classify_module",
    "default_rules", "register_invariance_rule", "registered_functions", "rule_for", "rule_for_call",
]

_KEY_ERROR = ("key must be an nn.Module subclass, a function, a tensor method's name (a str such as 'permute', "
              "or torch.Tensor.permute) or a dotted 'module.QualName' of a class or function")


def _dotted(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"


def table_key(key: Any) -> Any:
    """The table's key for what a user names: a class or function as it is, a tensor method (by
    name or as ``torch.Tensor.name``) by its name, a dotted name as it is.

    Raises:
        TypeError: ``key`` is none of these: a module instance (``nn.Hardtanh(0.5, 2)``: register its
            class), another class, a ``functools.partial``, a str that is neither a name nor dotted.
    """
    if isinstance(key, str):
        if "." in key or key.isidentifier():
            return key
        raise TypeError(f"{_KEY_ERROR}, got the str {key!r}")
    if isinstance(key, type):
        if issubclass(key, nn.Module):
            return key
        raise TypeError(f"{_KEY_ERROR}, got the class {key.__qualname__} (not an nn.Module subclass)")
    if inspect.isroutine(key) or isinstance(key, (torch._ops.OpOverload, torch._ops.OpOverloadPacket)):
        name = getattr(key, "__name__", None)
        if isinstance(name, str) and getattr(torch.Tensor, name, None) is key:
            return name  # torch.Tensor.permute: the method "permute"
        return key
    hint = f" (an instance: register its class, {type(key).__qualname__})" if isinstance(key, nn.Module) else ""
    raise TypeError(f"{_KEY_ERROR}, got a {type(key).__qualname__}{hint}")


def _class_key(key: Any, what: str) -> Any:
    """A module class or a dotted class name (the tracing policy's keys)."""
    if (isinstance(key, type) and issubclass(key, nn.Module)) or (isinstance(key, str) and "." in key):
        return key
    raise TypeError(f"{what}: key must be an nn.Module subclass or a dotted 'module.QualName' of one, got {key!r}")


def _match_class(table: dict[Any, Any], cls: type) -> Any:
    """The entry of ``cls`` or of its nearest base (by class or by dotted name); None if none."""
    for base in cls.__mro__:
        if base is nn.Module:
            break
        found = table.get(base)
        if found is None:
            found = table.get(f"{base.__module__}.{base.__qualname__}")
        if found is not None:
            return found
    return None


class RuleBook:
    """One table of padding-invariance rules and the tracer's policy, as one object.

    Entries are keyed by what a traced graph calls: a module class (the rule applies to the class
    and to subclasses that keep its ``forward``), a function (by identity, or by its dotted name),
    a tensor method (by name), or a dotted ``"module.QualName"`` of a class or function of a
    package not imported. Beside the rules, the tracing policy says which module classes the
    tracer traces through although they have a rule or a library lists them as leaves
    (:meth:`trace_through`), which packages' modules it keeps whole (:meth:`keep_whole_package`),
    which modules it runs as another function while it traces (:meth:`trace_as`), what it patches
    while it traces a network holding a module of a class (:meth:`tracing_patch`) or any network
    (:meth:`tracing_patch_all`), and what a
    computation on a value read from a map's size becomes (:meth:`register_sized`). Safe to use
    from several threads.

    Raises:
        TypeError: (``register``) a key that is none of the above (a module instance, say), or a
            rule that is not an :class:`InvarianceRule`.

    References:
        torch.ao.quantization ``backend_config`` (``BackendConfig``, ``BackendPatternConfig``).

    Example:
        >>> import vispos
        >>> from torch import nn
        >>> book = vispos.invariance.default_rules().copy()
        >>> book.register(nn.ConstantPad2d, vispos.Refuse("not in my models")).rule(nn.ConstantPad2d)
        Refuse(why='not in my models')
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._rules: dict[Any, InvarianceRule] = {}
        self._opened: dict[Any, str] = {}
        self._leaf_packages: dict[str, str] = {}
        self._substitutes: dict[Any, Callable[..., Any]] = {}
        self._patches: dict[Any, Callable[..., ContextManager[Any]]] = {}
        self._trace_patches: dict[str, Callable[..., ContextManager[Any]]] = {}
        self._sized: dict[Any, InvarianceRule] = {}

    _TABLES = ("_rules", "_opened", "_leaf_packages", "_substitutes", "_patches", "_trace_patches", "_sized")

    def __repr__(self) -> str:
        return (f"RuleBook({len(self._rules)} rules, {len(self._opened)} traced through, "
                f"{len(self._substitutes)} traced as, {len(self._patches) + len(self._trace_patches)} tracing patches)")

    def __len__(self) -> int:
        return len(self._rules)

    def __contains__(self, key: Any) -> bool:
        return table_key(key) in self._rules

    def keys(self) -> list[Any]:
        """The keys of the rules, a snapshot."""
        with self._lock:
            return list(self._rules)

    def items(self) -> list[tuple[Any, InvarianceRule]]:
        """``(key, rule)`` pairs, a snapshot."""
        with self._lock:
            return list(self._rules.items())

    def copy(self) -> "RuleBook":
        """A new book with the same entries (the rule objects shared: they are frozen)."""
        new = RuleBook()
        new.restore(self)
        return new

    def restore(self, other: "RuleBook") -> None:
        """Makes this book's entries those of ``other`` (a :meth:`copy` taken earlier), in place."""
        if not isinstance(other, RuleBook):
            raise TypeError(f"other must be a RuleBook, got {type(other).__name__}")
        with other._lock:
            tables = [dict(getattr(other, name)) for name in self._TABLES]
        with self._lock:
            for name, table in zip(self._TABLES, tables):
                getattr(self, name).clear()
                getattr(self, name).update(table)

    # ------------------------------------------------------------------------------ rules
    def register(self, key: type | Callable | str, rule: InvarianceRule) -> "RuleBook":
        """Sets the rule of ``key`` (see :func:`register_invariance_rule`); returns the book.

        Raises:
            TypeError: ``key`` is not a module class, function, method name or dotted name (a
                module instance included); ``rule`` is not an :class:`InvarianceRule`; a
                :class:`PaddingAware` rule for a key that is not a module class.
        """
        table = table_key(key)
        if not isinstance(rule, InvarianceRule):
            raise TypeError(f"rule must be an InvarianceRule (CellWise, PaddingAware, Refuse, ...), got "
                            f"{type(rule).__name__}")
        if isinstance(rule, PaddingAware) and not (isinstance(table, type) or (isinstance(table, str) and "." in table)):
            raise TypeError(f"rule: PaddingAware(fn) calls fn(module, x, padding), so its key must be an nn.Module "
                            f"subclass, got {key!r}")
        with self._lock:
            self._rules[table] = rule
        return self

    def rule(self, key: Any) -> InvarianceRule | None:
        """The entry registered under ``key`` itself (no base-class lookup); None if none."""
        return self._rules.get(table_key(key))

    def rule_for(self, module: nn.Module) -> InvarianceRule | None:
        """The rule of ``module``'s class, or of the nearest base whose ``forward`` it runs
        unchanged; None when no rule applies."""
        own = type(module).forward
        rules = self._rules
        for cls in type(module).__mro__:
            if cls is nn.Module:
                break
            rule = rules.get(cls) or rules.get(f"{cls.__module__}.{cls.__qualname__}")
            if rule is not None and (cls is type(module) or cls.forward is own):
                return rule
        return None

    def rule_for_call(self, op: str, target: Any, module: nn.Module | None = None) -> InvarianceRule | None:
        """The rule for a graph node: ``op`` is the node's ``"call_module"`` (``module`` the module
        called), ``"call_function"`` (``target`` the function) or ``"call_method"`` (``target`` the
        method's name). None when no entry applies."""
        if op == "call_module":
            return self.rule_for(module)
        if op == "call_function":
            if isinstance(target, type) and issubclass(target, nn.Module):
                return None
            try:
                rule = self._rules.get(target)
            except TypeError:  # an unhashable target
                rule = None
            return rule if rule is not None else self._rules.get(_dotted(target))
        if op == "call_method" and isinstance(target, str) and "." not in target:
            return self._rules.get(target)
        return None

    def registered_functions(self) -> tuple[Callable, ...]:
        """The keys that are plain Python functions outside torch (a user's ``my_act``), which the
        tracer hands to torch.fx's ``Tracer(autowrap_functions=...)`` so that each stays one call
        in the traced graph (as ``torch.fx.wrap`` would make it); a snapshot."""
        with self._lock:
            keys = list(self._rules)
        return tuple(k for k in keys if isinstance(k, types.FunctionType)
                     and not str(getattr(k, "__module__", "") or "").startswith("torch"))

    # --------------------------------------------------------------------- tracing policy
    def trace_through(self, key: type | str, why: str = "") -> "RuleBook":
        """The tracer opens modules of this class (and its subclasses): their insides are layers
        of the book, although a library lists the class as a leaf. Returns the book."""
        with self._lock:
            self._opened[_class_key(key, "trace_through")] = str(why)
        return self

    def keep_whole_package(self, prefix: str, why: str = "") -> "RuleBook":
        """The tracer keeps whole (one call of the graph) every module whose class is defined under
        the package ``prefix`` (``"torchvision.ops"``), unless it is traced through. Returns the book."""
        if not isinstance(prefix, str) or not prefix:
            raise TypeError(f"prefix must be a non-empty str (a package path), got {prefix!r}")
        with self._lock:
            self._leaf_packages[prefix] = str(why)
        return self

    def trace_as(self, key: type | str, fn: Callable[[nn.Module, Any, int], Any]) -> "RuleBook":
        """While tracing, a call of a module of this class is ``fn(module, x, num_axes)`` instead
        (written with operations the book knows). Returns the book."""
        if not callable(fn):
            raise TypeError(f"fn must be callable, got {type(fn).__name__}")
        with self._lock:
            self._substitutes[_class_key(key, "trace_as")] = fn
        return self

    def tracing_patch(self, key: type | str, patch: Callable[[nn.Module, int], ContextManager[Any]]) -> "RuleBook":
        """While tracing a network, for each of its modules of this class, ``patch(module,
        num_axes)`` is entered (a context manager, exited when the trace ends or fails), so that
        the traced graph is the module's own code. Returns the book."""
        if not callable(patch):
            raise TypeError(f"patch must be callable, got {type(patch).__name__}")
        with self._lock:
            self._patches[_class_key(key, "tracing_patch")] = patch
        return self

    def tracing_patch_all(self, name: str, patch: Callable[[nn.Module, int], ContextManager[Any]]) -> "RuleBook":
        """While tracing any network, ``patch(root, num_axes)`` is entered (``name`` labels the
        entry, say ``"torch.jit.isinstance"``). Returns the book."""
        if not isinstance(name, str) or not callable(patch):
            raise TypeError(f"tracing_patch_all takes a str name and a callable patch, got {name!r}, {patch!r}")
        with self._lock:
            self._trace_patches[name] = patch
        return self

    def register_sized(self, key: Callable | str, rule: InvarianceRule) -> "RuleBook":
        """The rule for a call on a feature map and a value read from a map's size (the canvas's
        size on a padded batch), keyed by function or method name. Returns the book."""
        if not isinstance(rule, InvarianceRule):
            raise TypeError(f"rule must be an InvarianceRule, got {type(rule).__name__}")
        with self._lock:
            self._sized[table_key(key)] = rule
        return self

    def opens(self, module: nn.Module) -> bool:
        """The tracer traces through ``module`` (:meth:`trace_through`)."""
        return _match_class(self._opened, type(module)) is not None

    def keeps_whole(self, module: nn.Module) -> bool:
        """The book makes ``module`` one call of the graph: a rule applies to it (an
        ``nn.Sequential`` that runs Sequential's own forward excepted: its children are the layers), or its class is defined under a
        package kept whole; never for a module traced through."""
        if self.opens(module):
            return False
        if self.rule_for(module) is not None:  # a Sequential with its own forward (ASPPPooling) is one layer
            return not isinstance(module, nn.Sequential) or type(module).forward is not nn.Sequential.forward
        where = type(module).__module__
        return any(where == p or where.startswith(p + ".") for p in self._leaf_packages)

    def substitute_for(self, module: nn.Module) -> Callable[..., Any] | None:
        """The function a call of ``module`` is traced as (:meth:`trace_as`); None if none."""
        return _match_class(self._substitutes, type(module)) if self._substitutes else None

    def patches_for(self, root: nn.Module, num_axes: int) -> Iterator[ContextManager[Any]]:
        """The tracing patches of a trace of ``root``: :meth:`tracing_patch_all`'s, then the
        :meth:`tracing_patch` of each of ``root``'s modules, ``root`` included."""
        for patch in list(self._trace_patches.values()):
            yield patch(root, num_axes)
        if not self._patches:
            return
        for module in root.modules():
            patch = _match_class(self._patches, type(module))
            if patch is not None:
                yield patch(module, num_axes)

    def sized_rule(self, op: str, target: Any) -> InvarianceRule | None:
        """The :meth:`register_sized` rule of a ``call_function`` / ``call_method`` node; None if none."""
        if op == "call_method" and isinstance(target, str):
            return self._sized.get(target)
        if op == "call_function":
            try:
                return self._sized.get(target) or self._sized.get(_dotted(target))
            except TypeError:
                return None
        return None


#: the global book: built empty here and filled, once, when this package is imported (_builtin)
_DEFAULT = RuleBook()
#: the global book's rules (kept for code that reads the table directly)
_RULES = _DEFAULT._rules


def default_rules() -> RuleBook:
    """The global :class:`RuleBook`: every built-in entry, and whatever was registered with
    :func:`register_invariance_rule`. ``default_rules().copy()`` is a book for one call's own
    entries (``make_padding_invariant(..., rules=book)``)."""
    return _DEFAULT


def as_book(rules: Any) -> RuleBook:
    """``rules`` checked: a :class:`RuleBook`, or None for the global one.

    Raises:
        TypeError: ``rules`` is neither.
    """
    if rules is None:
        return _DEFAULT
    if not isinstance(rules, RuleBook):
        raise TypeError(f"rules must be a vispos.invariance.RuleBook or None, got {type(rules).__name__}")
    return rules


@_deprecation.renamed_kwargs(module_type="key")
def register_invariance_rule(key: type | Callable | str, rule: InvarianceRule) -> None:
    """Registers in the global rule book how padding invariance runs what a graph node calls: a
    module type, a function, or a tensor method. The rule is :class:`CellWise`,
    :class:`PaddingAware` (modules), :class:`Refuse` or any :class:`InvarianceRule`.

    One book holds every entry, the built-in ones included (convolutions, pools, norms,
    activations, ``torch.cat``, ``x.mean``, ...), all registered when vispos' invariance package
    is imported, so a rule registered here is the one that runs. A registered module type is also
    kept whole (a leaf) when vispos traces a network; its rule applies to the type and its
    subclasses that do not override ``forward``. A function is matched by identity (or by its
    dotted name), a method by its name. A registered Python function of your own (not one of
    torch's) is kept whole too: one node of the traced graph wherever a module's ``forward`` calls
    it by its name, with no ``torch.fx.wrap`` (torch.fx's ``autowrap_functions``). Registering a
    key again replaces its rule. Safe to call from several threads. For one call only, register
    in a copy instead: ``default_rules().copy().register(key, rule)``, passed as
    ``make_padding_invariant(..., rules=book)``.

    Args:
        key (type, callable or str): an ``nn.Module`` subclass; a function called in a forward
            (``my_act``, ``F.conv2d``); a tensor method's name (``"permute"``, or
            ``torch.Tensor.permute``); or the dotted ``"module.QualName"`` of a class or function
            of a package not imported. ``module_type=`` is the deprecated keyword.
        rule (InvarianceRule): the rule.

    Raises:
        TypeError: ``key`` is none of these (a module instance such as ``nn.Hardtanh(0.5, 2)``, a
            non-module class, a str that is neither a name nor dotted), or ``rule`` is not an
            :class:`InvarianceRule`, or a :class:`PaddingAware` rule for a key that is not a
            module class.

    References:
        torch.ao.quantization's ``BackendPatternConfig`` (rules registered per pattern: module,
        function or method; the rewriter asks the table); torchvision
        ``models/feature_extraction.py`` (leaf modules).

    Example:
        >>> import torch
        >>> import vispos
        >>> from torch import nn
        >>> class Gate(nn.Module):
        ...     def forward(self, x):
        ...         return x * x.sigmoid()
        >>> vispos.register_invariance_rule(Gate, vispos.CellWise())
        >>> def gate(x):
        ...     return x * torch.sigmoid(x)
        >>> vispos.register_invariance_rule(gate, vispos.CellWise())
    """
    _DEFAULT.register(key, rule)


def registered_functions() -> tuple[Callable, ...]:
    """The global book's :meth:`RuleBook.registered_functions`.

    Returns:
        tuple of functions: a snapshot (empty until a user registers a function of their own:
        every built-in function key is torch's or a builtin).
    """
    return _DEFAULT.registered_functions()


def rule_for(module: nn.Module) -> InvarianceRule | None:
    """The global book's rule of ``module``'s class, or of the nearest base whose ``forward`` it
    runs unchanged; None when no rule applies."""
    return _DEFAULT.rule_for(module)


def rule_for_call(op: str, target: Any, module: nn.Module | None = None) -> InvarianceRule | None:
    """The global book's :meth:`RuleBook.rule_for_call`."""
    return _DEFAULT.rule_for_call(op, target, module)


def classify_module(m: nn.Module) -> tuple[str, Any]:
    """``(kind, rule)`` of a module in the global book: ``"refuse"`` when no rule applies (the
    tracer opens the module and the rewrite judges what it calls), else the rule's kind
    (``"refused"`` for a rule that refuses every call: kept whole, so its refusal names it)."""
    rule = rule_for(m)
    if rule is None:
        return "refuse", Refuse("a module vispos does not know how to run on a padded batch (no rule for it; "
                                "register one with vispos.register_invariance_rule)")
    return ("refused" if rule.refusal() is not None else rule.kind), rule
