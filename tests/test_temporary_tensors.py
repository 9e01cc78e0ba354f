"""No call takes the device pointers of two temporary tensors (a static check over llamacmp/, tests/, benchmarks/).

The bug it refuses: in `native.f(be.from_host(a).ptr, be.from_host(b).ptr)` the first tensor is held by nothing once
its `.ptr` is read, so CPython drops it at once and its block goes back to the arena's free list; the second upload,
of the same size class, gets that block, and both arguments are one address: the kernel reads the second input
where the first should be, which looks like a kernel bug (the CQ2 GEMV test on the H200, benchmarks/RESULTS.md). One
temporary per call is harmless: nothing is allocated before the kernel is queued, and a backend runs on one stream,
so a later allocation's writes queue behind it. Two or more in one call (or one inside a comprehension or
generator, one per item) alias.

A temporary is an expression that makes a tensor nobody else holds: a call of an allocator (ALLOCATORS), or of a
function anywhere in the tree whose every return is one (found here, e.g. tests/cuda_helpers.up and most backend
ops), possibly indexed (`be.quantize(x)[0]`), a field of one (`be.upload_matrix(w).body`) or a view of one (views
hold their base). A tensor bound to a name, an attribute or a container is not temporary, nor is the result of a
call not known to allocate (it may return a cached tensor, e.g. CudaBackend._positions)."""
from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SCANNED = ("llamacmp", "tests", "benchmarks")

POINTERS = {"ptr", "head_ptr"}       # DeviceTensor.ptr, QuantMatrix.head_ptr: a tensor's address
POINTER_METHODS = {"row_ptr"}        # DeviceTensor.row_ptr(row): an address inside it
VIEWS = {"view", "rows", "reshape"}  # DeviceTensor.view/.rows, CudaBackend.rows/.reshape: views holding their base
# Calls that return new device memory; the tree's functions returning one of these are added (creators()).
ALLOCATORS = {"DeviceTensor", "empty", "zeros", "from_host", "upload_matrix", "upload_vector", "quantize"}
COMPREHENSIONS = (ast.ListComp, ast.SetComp, ast.DictComp, ast.GeneratorExp)
SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)


def callee(call: ast.Call) -> str | None:
    """The called function's name; None for numpy's (np.empty, np.zeros: host arrays)."""
    f = call.func
    if isinstance(f, ast.Attribute):
        return None if isinstance(f.value, ast.Name) and f.value.id in ("np", "numpy") else f.attr
    return f.id if isinstance(f, ast.Name) else None


def own_nodes(node: ast.AST):
    """The nodes of `node`'s body, not descending into nested functions, lambdas or classes."""
    for child in ast.iter_child_nodes(node):
        yield child
        if not isinstance(child, SCOPES):
            yield from own_nodes(child)


def fresh(e: ast.expr | None, makers: set[str], local: set[str]) -> bool:
    """`e` is a new tensor (or a tuple of them): an allocating call, or a local name only ever bound to one."""
    if isinstance(e, ast.Call):
        return callee(e) in makers
    if isinstance(e, ast.Tuple):
        return bool(e.elts) and all(fresh(x, makers, local) for x in e.elts)
    if isinstance(e, ast.Subscript):                  # an item of a new tuple (`q, d = be.quantize(x)`)
        return fresh(e.value, makers, local)
    return isinstance(e, ast.Name) and e.id in local


def summary(fn: ast.FunctionDef) -> tuple[list[ast.expr | None], dict[str, list[ast.expr | None]]]:
    """-> (what each `return` of `fn` gives, the values bound to each local name; None: not known)."""
    bound: dict[str, list[ast.expr | None]] = {a.arg: [None] for a in ast.walk(fn.args) if isinstance(a, ast.arg)}
    rets, handled = [], set()
    for node in own_nodes(fn):
        if isinstance(node, ast.Return):
            rets.append(node.value)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                pairs = [(target, node.value)]
                if isinstance(target, ast.Tuple):
                    same = isinstance(node.value, ast.Tuple) and len(node.value.elts) == len(target.elts)
                    pairs = [(t, node.value.elts[i] if same else ast.Subscript(node.value, ast.Constant(i)))
                             for i, t in enumerate(target.elts)]
                for t, v in pairs:
                    if isinstance(t, ast.Name):
                        bound.setdefault(t.id, []).append(v)
                        handled.add(id(t))
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and id(node) not in handled:
            bound.setdefault(node.id, []).append(None)     # for/with/walrus/augmented targets: not known new
    return rets, bound


def returns_fresh(rets: list, bound: dict, makers: set[str]) -> bool:
    """Every `return` gives a new tensor (directly, or through locals bound only to new tensors)."""
    local = {n for n, vs in bound.items() if all(fresh(v, makers, set()) for v in vs)}
    return bool(rets) and all(fresh(r, makers, local) for r in rets)


def creators(trees: list[ast.Module]) -> set[str]:
    """ALLOCATORS and the names of the functions in `trees` that return what they allocate (to a fixed point)."""
    fns = [(n.name, summary(n)) for t in trees for n in ast.walk(t)
           if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) and n.name not in ALLOCATORS | VIEWS]
    fns = [(name, s) for name, s in fns if s[0]]
    makers = set(ALLOCATORS)
    while True:
        more = {name for name, (rets, bound) in fns if name not in makers and returns_fresh(rets, bound, makers)}
        if not more:
            return makers
        makers |= more


def pointer_of(node: ast.AST) -> ast.expr | None:
    """The tensor expression whose address `node` reads, if it reads one."""
    if isinstance(node, ast.Attribute) and node.attr in POINTERS:
        return node.value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in POINTER_METHODS:
        return node.func.value
    return None


def temporary(e: ast.expr, makers: set[str]) -> bool:
    """`e` is held by nothing but this expression: a new tensor, or a view, index or field of one."""
    while True:
        if isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr in VIEWS:
            e = e.func.value
        elif isinstance(e, (ast.Attribute, ast.Subscript)):
            e = e.value
        else:
            return isinstance(e, ast.Call) and callee(e) in makers


def temporary_pointers(node: ast.AST, makers: set[str], repeated: bool = False) -> list[tuple[ast.AST, int]]:
    """(pointer read, how many tensors it stands for) of each temporary under `node`: 2 inside a comprehension
    (one tensor per item, each dropped before the next is made). Lambda bodies run later and are left out."""
    if isinstance(node, SCOPES):
        return []
    out = []
    t = pointer_of(node)
    if t is not None and temporary(t, makers):
        out.append((node, 2 if repeated else 1))
    for child in ast.iter_child_nodes(node):
        out += temporary_pointers(child, makers, repeated or isinstance(node, COMPREHENSIONS))
    return out


def aliasing_calls(tree: ast.Module, makers: set[str]) -> list[tuple[ast.Call, list[ast.AST]]]:
    """Calls whose arguments read the pointers of two or more temporaries; of nested ones, only the innermost."""
    found = []
    for call in ast.walk(tree):
        if isinstance(call, ast.Call):
            reads = [r for a in call.args + [k.value for k in call.keywords] for r in temporary_pointers(a, makers)]
            if sum(n for _, n in reads) >= 2:
                found.append((call, [r for r, _ in reads]))
    inner = {id(c) for c, reads in found for c2, reads2 in found
             if c2 is not c and set(map(id, reads)) == set(map(id, reads2)) and c2 in ast.walk(c)}
    return [(c, reads) for c, reads in found if id(c) not in inner]


def messages(name: str, tree: ast.Module, makers: set[str]) -> list[str]:
    return [f"{name}:{call.lineno}: {ast.unparse(call.func)}(...) takes the pointers of temporary tensors "
            f"({', '.join(ast.unparse(r) for r in reads)}): bind the tensors to names first and keep them until "
            f"the results are read back (a dropped tensor's block goes to the next allocation of its size, so the "
            f"pointers alias)" for call, reads in aliasing_calls(tree, makers)]


def check_source(src: str, makers: set[str] | None = None) -> list[str]:
    tree = ast.parse(src)
    return messages("<snippet>", tree, creators([tree]) if makers is None else makers)


# -- why: the arena on the CPU ---------------------------------------------------------------------------------

class FakeNative:
    """DeviceArena's two native calls, with no device: one fake chunk at 1 MiB."""

    def malloc(self, nbytes: int) -> int:
        return 1 << 20

    def cmp_free(self, ptr: int) -> None:
        pass


def test_a_temporarys_block_goes_to_the_next_tensor_of_its_size():
    """The bug itself: the address of a temporary is the next tensor's; bound tensors get two blocks."""
    from llamacmp.backends.cuda_memory import DeviceArena, DeviceTensor
    arena = DeviceArena(FakeNative(), cap=1 << 30, chunk=1 << 20)
    first, second = DeviceTensor(arena, (4, 42), "u8", "a").ptr, DeviceTensor(arena, (4, 10), "u8", "b").ptr
    assert first == second
    a, b = DeviceTensor(arena, (4, 42), "u8", "a"), DeviceTensor(arena, (4, 10), "u8", "b")
    assert a.ptr != b.ptr


# -- the checker on snippets -----------------------------------------------------------------------------------------

def test_two_temporary_uploads_in_one_call_are_refused():
    """The CQ2 harness's call, a local upload helper, an indexed quantize, a view and a comprehension."""
    bad = [
        "be.native.cmp_f(be.from_host(w.body).ptr, be.from_host(w.head).ptr, out.ptr, n)",
        "def up(be, a):\n    t = be.from_host(a, 'f32')\n    return t\nf(up(be, x).ptr, be.empty((4,)).row_ptr(1))",
        "be.native.g(be.quantize(x)[0].ptr, be.quantize(x)[1].ptr)",
        "f(be.zeros((2, 3), 'f32', 'w').view((6,)).ptr, c_void_p(be.from_host(b).ptr))",
        "f((c_void_p * k)(*(be.from_host(a).ptr for a in xs)), out.ptr)",
        "f(be.upload_matrix(w).body.ptr, be.upload_matrix(w).head_ptr)",
    ]
    for src in bad:
        got = check_source(src)
        assert len(got) == 1 and got[0].startswith("<snippet>:") and "bind the tensors to names" in got[0], src
    assert check_source(bad[0])[0].startswith("<snippet>:1: be.native.cmp_f(...)")
    assert "up(be, x).ptr, be.empty((4,)).row_ptr(1)" in check_source(bad[1])[0]


def test_bound_cached_and_single_temporaries_pass():
    """Named tensors, a view of a named tensor, one temporary per call, calls not known to allocate (a cached
    tensor), a pointer read inside a lambda, and a helper that may return something it did not allocate."""
    good = [
        "body, head = be.from_host(w.body), be.from_host(w.head)\nbe.native.cmp_f(body.ptr, head.ptr, out.ptr)",
        "be.native.cmp_q(be.from_host(x).ptr, body.ptr, head.ptr, rows, cols)",
        "f(t.view((6,)).ptr, t.rows(1, 2).ptr, be.rows(t, 0, 1).ptr, be.reshape(t, (6,)).ptr, self.arena.x.ptr)",
        "f(self._positions(batch).ptr, cache[k].ptr, ws[0].head_ptr, [o.row_ptr(t0) for o in outs])",
        "f(lambda: be.empty((1,)).ptr, lambda: be.empty((1,)).ptr)",
        "def get(be, a):\n    if a is None:\n        return cached\n    return be.from_host(a)\n"
        "f(get(be, x).ptr, get(be, y).ptr)",
        "f(np.empty(3).ctypes.data, np.zeros(3).ctypes.data)",
    ]
    for src in good:
        assert check_source(src) == [], src


# -- the tree ---------------------------------------------------------------------------------------------------------

def test_no_call_in_the_tree_takes_two_temporaries_pointers():
    files = sorted(f for d in SCANNED for f in (ROOT / d).rglob("*.py"))
    trees = {f: ast.parse(f.read_text(encoding="utf-8"), str(f)) for f in files}
    makers = creators(list(trees.values()))
    assert {"up", "rmsnorm", "_q8_buffers"} <= makers, "the helpers and backend ops are no longer found as creators"
    bad = [m for f, tree in trees.items() for m in messages(str(f.relative_to(ROOT)), tree, makers)]
    assert not bad, "\n".join(bad)
