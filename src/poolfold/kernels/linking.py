"""Helpers compiled only to be linked into the kernels that call them.

numba finishes every function it compiles as if Python might call it: it optimises the
function's LLVM module (its callees linked in) and turns it into machine code.  A helper is
never called from Python: each caller links the helper's optimised module into its own,
optimises the whole and turns that into machine code.  The helper's own machine code is never
run, and making it is most of what finishing costs, at every level of nesting (a helper's
callers are helpers too, up to the kernel).

A helper's library here (:class:`LinkOnlyLibrary`) is finished as numba finishes any, its
callees linked in and the whole optimised at numba's level, and stops there: no machine code.
Its callers get the module they got before, optimised the same way.  One difference: numba's
machine-code step rewrote a library's module in place (LLVM's code generation prepares the
IR it emits: loop strength reduction, address sinking), and callers linked that rewritten
module; now they link the module as the optimiser left it, as LLVM's pipeline expects.  With
no machine code a helper cannot be cached to disk on its own (numba caches machine code): a
kernel compiled in a new process compiles its helpers again, and one loaded from the cache
needs none of them.

This leans on numba's compiler pipeline (``pipeline_class``, a documented extension point)
and on its CPU code library's internals; where the installed numba lacks what it needs,
helpers are compiled as numba compiles any function (:data:`AVAILABLE` False): correct, and
slower to compile (tests/test_linking.py fails, to say so).
"""

from __future__ import annotations

try:
    import llvmlite.binding as llvm
    import llvmlite.ir as llvmir
    from numba.core import cgutils
    from numba.core.codegen import JITCodeLibrary
    from numba.core.compiler import CompilerBase, DefaultPassBuilder
    from numba.core.compiler_lock import require_global_compiler_lock
    from numba.core.compiler_machinery import LoweringPass, register_pass
    from numba.core.typed_passes import AnnotateTypes

    AVAILABLE = all(hasattr(JITCodeLibrary, name)
                    for name in ("_get_module_for_linking", "_optimize_final_module",
                                 "_raise_if_finalized", "_finalize_dynamic_globals"))
except ImportError:  # pragma: no cover - another numba's layout
    AVAILABLE = False


if AVAILABLE:

    class LinkOnlyLibrary(JITCodeLibrary):
        """A helper's code: its module with its callees' linked in, optimised, and never
        turned into machine code (see the module doc)."""

        def finalize(self):
            """numba's ``CPUCodeLibrary.finalize`` up to its machine code."""
            require_global_compiler_lock()
            self._raise_if_finalized()
            seen = set()
            for library in self._linking_libraries:
                if library not in seen:
                    seen.add(library)
                    self._reload_init.update(library._reload_init)
                    self._final_module.link_in(library._get_module_for_linking(),
                                               preserve=True)
            self._optimize_final_module()
            self._final_module.verify()
            self._finalize_dynamic_globals()
            self._finalized = True

        def get_pointer_to_function(self, name):
            """No machine code, so no entry: numba asks for one it then never calls (a
            helper has no wrapper that Python could call)."""
            self._ensure_finalized()
            return 0

        @property
        def codegen(self):
            return _CodegenWithoutEnvironment(self._codegen)

    class _CodegenWithoutEnvironment:
        """The JIT codegen as a link-only library shows it to numba, which then points the
        function's *environment* (a global that the function's code reads to reach the
        Python objects it needs, to raise an exception with run-time values for one) at
        those objects.  The global lives in the function's machine code, and a link-only
        library has none; it is defined here, alone, in a module of its own: the callers'
        code, which declares it too, then finds it as it found the helper's own before."""

        def __init__(self, codegen):
            self._codegen = codegen

        def __getattr__(self, name):
            return getattr(self._codegen, name)

        def set_env(self, env_name, env):
            module = self._codegen._create_empty_module(env_name)
            held = llvmir.GlobalVariable(module, cgutils.voidptr_t, name=env_name)
            held.linkage = "common"  # as numba declares it in each function's module
            held.initializer = cgutils.get_null_value(held.type.pointee)
            self._codegen._add_module(llvm.parse_assembly(str(module)))
            self._codegen._engine.finalize_object()
            self._codegen.set_env(env_name, env)

    @register_pass(mutates_CFG=False, analysis_only=False)
    class _UseLinkOnlyLibrary(LoweringPass):
        _name = "poolfold_link_only_library"

        def __init__(self):
            LoweringPass.__init__(self)

        def run_pass(self, state):
            if state.library is None:
                state.library = LinkOnlyLibrary(state.targetctx.codegen(),
                                                state.func_id.func_qualname)
            return False  # the IR is untouched: numba checks none of it again

    class HelperCompiler(CompilerBase):
        """numba's nopython pipeline, lowering into a :class:`LinkOnlyLibrary`."""

        def define_pipelines(self):
            pipeline = DefaultPassBuilder.define_nopython_pipeline(self.state)
            pipeline.add_pass_after(_UseLinkOnlyLibrary, AnnotateTypes)
            pipeline.finalize()
            return [pipeline]
