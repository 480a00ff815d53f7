"""Compile a Triton kernel for an NVIDIA target without a GPU (Triton bundles ptxas).

The CPU tests run kernels under the interpreter, which accepts programs the compiler rejects;
compiling for sm_90a here catches those errors, and the result's ``.asm`` (ttir / ttgir / llir /
ptx / cubin) and register counts show what a GPU would run. Pointer arguments get the 16-byte
divisibility hint a real launch gives aligned tensors. Needs a process where TRITON_INTERPRET is
unset (the interpreter replaces ``@triton.jit`` functions).
"""

from __future__ import annotations


def compile_for_nvidia(
    fn,
    constexprs: dict,
    arg_types: dict[str, str],
    arch: int = 90,
    num_warps: int = 4,
    num_stages: int | None = None,
):
    """``fn``: a ``@triton.jit`` kernel; ``constexprs``: values of its constexpr arguments;
    ``arg_types``: Triton types of the others ("*fp32", "i64", ...; unnamed ones are "i32")."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler.compiler import ASTSource

    if not isinstance(fn, triton.runtime.jit.JITFunction):
        raise RuntimeError("aot compile needs TRITON_INTERPRET unset when triton is imported")
    sig = {n: ("constexpr" if n in constexprs else arg_types.get(n, "i32")) for n in fn.arg_names}
    attrs = {
        (i,): [["tt.divisibility", 16]]
        for i, n in enumerate(fn.arg_names)
        if sig[n].startswith("*")
    }
    return triton.compile(
        ASTSource(fn, sig, constexprs, attrs=attrs),
        target=GPUTarget("cuda", arch, 32),
        options=dict(num_warps=num_warps)
        | ({} if num_stages is None else dict(num_stages=num_stages)),
    )
