"""The kernels' ABI, held together: every function ``csrc/mnistflow_kernels.h`` declares has a
ctypes binding in ``kernels.SIGNATURES`` with the same number and kinds of arguments and the
same return type, and nothing else is bound; every source includes the header (so the compiler
checks each definition against its declaration) and the library exports only what it declares.
A mismatch fails here instead of corrupting memory at the first call. (That the built library
exports exactly these symbols is checked in tests/integration/test_kernels.py.)"""
from __future__ import annotations

import ctypes
import re

import pytest

from mnistflow import kernels

HEADER = kernels.CSRC / "mnistflow_kernels.h"

# C scalar types -> the ctypes type that passes them (x86-64 / aarch64 Linux: int is 32 bits)
C_SCALARS = {"int64_t": ctypes.c_int64, "int": ctypes.c_int, "double": ctypes.c_double, "float": ctypes.c_float,
             "uint8_t": ctypes.c_uint8, "uint16_t": ctypes.c_uint16, "uint32_t": ctypes.c_uint32}


def declarations(text: str) -> dict[str, tuple[list[str], str]]:
    """``MNISTFLOW_API`` declarations in C text: name -> (argument types, return type), each
    type normalized to its base type and a '*' per pointer level (qualifiers and names dropped)."""
    text = re.sub(r"/\*.*?\*/|//[^\n]*", " ", text, flags=re.S)
    out = {}
    for ret, name, args in re.findall(r"MNISTFLOW_API\s+([\w\s*]+?)\s*\b(\w+)\s*\(([^)]*)\)\s*;", text):
        params = [] if args.strip() in ("", "void") else [a for a in args.split(",")]
        assert name not in out, f"{name} declared twice"
        out[name] = ([_ctype(p, named=True) for p in params], _ctype(ret, named=False))
    return out


def _ctype(decl: str, named: bool) -> str:
    stars = decl.count("*")
    words = [w for w in re.findall(r"\w+", decl) if w not in ("const", "restrict", "volatile")]
    if named:
        words = words[:-1]  # the parameter's name
    assert len(words) == 1, f"cannot read the C type of '{decl.strip()}'"
    return words[0] + "*" * stars


def matches(c_type: str, binding) -> bool:
    """Whether a ctypes type passes a C type: a scalar by its own type; a pointer by
    ``c_void_p`` (a tensor's ``data_ptr()``) or ``POINTER(t)`` with ``t`` passing the pointee."""
    if c_type == "void":
        return binding is None
    if c_type.endswith("*"):
        if binding is ctypes.c_void_p:
            return True
        pointee = getattr(binding, "_type_", None)
        return isinstance(binding, type) and issubclass(binding, ctypes._Pointer) and matches(c_type[:-1], pointee)
    if c_type not in C_SCALARS:
        raise AssertionError(f"C type {c_type} has no ctypes twin in this test: add it to C_SCALARS")
    return binding is C_SCALARS[c_type]


def mismatches(decls: dict, bindings: dict) -> list[str]:
    """Every difference between the header's declarations and the ctypes bindings, in words."""
    out = [f"{n}: declared in the header, not bound in kernels.SIGNATURES" for n in decls.keys() - bindings.keys()]
    out += [f"{n}: bound in kernels.SIGNATURES, not declared in the header" for n in bindings.keys() - decls.keys()]
    for name in sorted(decls.keys() & bindings.keys()):
        (c_args, c_ret), (args, ret) = decls[name], bindings[name]
        if len(c_args) != len(args):
            out.append(f"{name}: {len(c_args)} arguments in C, {len(args)} bound")
            continue
        out += [f"{name}: argument {i} is {c} in C, bound as {getattr(b, '__name__', b)}"
                for i, (c, b) in enumerate(zip(c_args, args)) if not matches(c, b)]
        if not matches(c_ret, ret):
            out.append(f"{name}: returns {c_ret} in C, bound as {getattr(ret, '__name__', ret)}")
    return out


def test_every_declared_function_is_bound_with_its_c_signature():
    decls = declarations(HEADER.read_text())
    assert len(decls) >= 19  # the parser found the declarations (not an empty match)
    assert mismatches(decls, kernels.SIGNATURES) == []


def test_a_wrong_binding_is_caught():
    """The check is not vacuous: each kind of mistake shows."""
    decls = declarations(HEADER.read_text())
    sig = dict(kernels.SIGNATURES)
    p, i64, n = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int
    bad = {
        "maxpool2x2_forward_bf16": ([p, p, p, i64, i64, i64, i64], n),  # an argument missing
        "bnrelu_eval_f32": ([p, p, p, p, i64, n, n], None),  # int where C has int64_t
        "swap_nc_u16": ([p, p, i64, i64, i64, n], n),  # a void function read as int
        "bnrelu_forward_f32": ([p] * 8 + [i64, i64, ctypes.c_float, ctypes.c_double, n], n),  # float for double
        "newton_schulz_bf16": ([n, p, ctypes.POINTER(n), p, n, n, n], n),  # int* for int64_t*
    }
    for name, wrong in bad.items():
        assert len(mismatches(decls, {**sig, name: wrong})) == 1, name
    del sig["col2im_f32"]
    assert mismatches(decls, sig) == ["col2im_f32: declared in the header, not bound in kernels.SIGNATURES"]
    assert mismatches(decls, {**kernels.SIGNATURES, "new_kernel": ([], n)}) == [
        "new_kernel: bound in kernels.SIGNATURES, not declared in the header"]


def test_the_parser_reads_types_names_and_pointers():
    text = """/* a comment with MNISTFLOW_API int fake(void); inside */
        MNISTFLOW_API void f(const uint16_t *restrict x, float **xs, int64_t n,
                             int threads);  // trailing
        MNISTFLOW_API int g(void);"""
    assert declarations(text) == {"f": (["uint16_t*", "float**", "int64_t", "int"], "void"), "g": ([], "int")}
    with pytest.raises(AssertionError, match="no ctypes twin"):
        matches("long", ctypes.c_long)


def test_every_source_includes_the_header_and_every_file_is_built_and_shipped():
    for name in kernels.SOURCES:
        assert '#include "mnistflow_kernels.h"' in (kernels.CSRC / name).read_text(), name
    on_disk = {p.name for p in kernels.CSRC.iterdir() if p.suffix in (".c", ".h")}
    assert on_disk == set(kernels.SOURCES) | set(kernels.HEADERS)  # all hashed into the library's name
    assert "-fvisibility=hidden" in kernels.CFLAGS  # exported: only what the header marks MNISTFLOW_API
    assert "visibility(\"default\")" in HEADER.read_text()
