"""numba's disk cache for the kernels, loading a kernel without parsing its linking module.

numba caches a compiled function as its machine code and, beside it, the bitcode of its LLVM
module (so that a function compiled later can link it in and inline it).  Loading the function
parses that bitcode at once, though nothing may ever link it: a kernel is called from Python.
A MaxPool kernel's bitcode is two to three times its machine code, and parsing it was most of
a fresh process's first call (8x8 planes, a warm cache: 12 of 17 ms).

This cache writes what numba writes plus the names of the symbols the module defines (what
numba reads the parsed module for when it loads), and parses the bitcode only if something
asks to link the kernel.  Entries numba wrote itself load as numba loads them.

It leans on numba's caching and code-library internals (checked against numba 0.68.1):
where the installed numba lacks what it needs, :data:`AVAILABLE` is False and kernels are
cached as numba caches them (tests/test_caching.py fails, to say so).
"""

from __future__ import annotations

import inspect

try:
    import llvmlite.binding as llvm
    from numba.core import caching, compiler
    from numba.core.codegen import JITCodeLibrary

    AVAILABLE = (
        all(hasattr(JITCodeLibrary, name)
            for name in ("enable_object_caching", "_set_compiled_object",
                         "_finalize_final_module", "_get_module_for_linking"))
        and hasattr(caching, "CompileResultCacheImpl")
        and list(inspect.signature(compiler.CompileResult._rebuild).parameters)
        == ["target_context", "libdata", "fndesc", "env", "signature", "objectmode", "lifted",
            "typeann", "reload_init", "referenced_envs"])
except (ImportError, AttributeError, TypeError, ValueError):  # pragma: no cover
    AVAILABLE = False

# The kind this cache gives its entries' code: numba's own are "object" and "bitcode".
LAZY_OBJECT = "poolfold-lazy-object"


def defined_symbols(module) -> tuple[str, ...]:
    """The functions and globals ``module`` defines, as numba's engine records them."""
    return tuple(sorted(value.name for values in (module.functions, module.global_variables)
                        for value in values if not value.is_declaration))


def load_library(codegen, name: str, object_code: bytes, bitcode: bytes,
                 symbols: tuple[str, ...]):
    """A code library of ``object_code``, ready to run, as numba's ``_unserialize`` makes it
    for an "object" entry, its linking module parsed from ``bitcode`` on first use only."""
    library = codegen.create_library(name)
    library.enable_object_caching()
    library._set_compiled_object(object_code)

    def module_for_linking():
        if library._shared_module is None:
            library._shared_module = llvm.parse_bitcode(bitcode)
        return library._shared_module

    library._get_module_for_linking = module_for_linking
    library._finalize_final_module()
    codegen._engine._defined_symbols.update(symbols)
    return library


if AVAILABLE:

    class _LazyLinkingImpl(caching.CompileResultCacheImpl):
        """numba's compile-result cache, its code entries of kind :data:`LAZY_OBJECT`."""

        def reduce(self, cres):
            libdata, *rest = cres._reduce()
            name, kind, data = libdata
            if kind != "object":  # pragma: no cover - numba caches machine code
                return (libdata, *rest)
            object_code, bitcode = data
            symbols = defined_symbols(cres.library._get_module_for_linking())
            return ((name, LAZY_OBJECT, (object_code, bitcode, symbols)), *rest)

        def rebuild(self, target_context, payload):
            libdata, fndesc, env, signature, objectmode, lifted, typeann, reload_init, \
                referenced_envs = payload
            name, kind, data = libdata
            if kind != LAZY_OBJECT:
                return super().rebuild(target_context, payload)
            # numba's CompileResult._rebuild, with the library loaded here
            for function in reload_init or ():
                function()
            library = load_library(target_context.codegen(), name, *data)
            cfunc = target_context.get_executable(library, fndesc, env)
            result = compiler.CompileResult(
                target_context=target_context, typing_context=target_context.typing_context,
                library=library, environment=env, entry_point=cfunc, fndesc=fndesc,
                type_annotation=typeann, signature=signature, objectmode=objectmode,
                lifted=lifted, typing_error=None, call_helper=None, metadata=None,
                reload_init=reload_init, referenced_envs=referenced_envs)
            for referenced in referenced_envs:
                library.codegen.set_env(referenced.env_name, referenced)
            return result

    class KernelCache(caching.FunctionCache):
        """numba's function cache, its entries loaded by :class:`_LazyLinkingImpl`."""

        _impl_class = _LazyLinkingImpl


class _CacheOnFirstUse:
    """A dispatcher's cache, made when numba first reaches for it: making one looks up its
    folder and source file (about 0.1 ms a kernel, a few ms of ``import poolfold`` for all),
    and most processes call a few kernels."""

    def __init__(self, py_func):
        self._py_func = py_func
        self._made = None

    def __getattr__(self, name):
        if self._made is None:
            self._made = KernelCache(self._py_func)
        return getattr(self._made, name)


def enable(dispatcher):
    """Cache ``dispatcher`` (a numba dispatcher made without ``cache=True``) on disk: with
    :class:`KernelCache`, or numba's own cache where this one is not available."""
    if AVAILABLE:
        dispatcher._cache = _CacheOnFirstUse(dispatcher.py_func)
    else:  # pragma: no cover - another numba's layout
        dispatcher.enable_caching()
    return dispatcher
