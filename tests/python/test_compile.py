"""torch.library.opcheck, the fake kernel, and torch.compile(fullgraph=True)."""
import pytest
import torch
import torch.nn.functional as F

import fattn
from conftest import assert_close_to_reference, qkv, randn, reference


OPCHECK_CASES = [
    # (args, kwargs) of torch.ops.fattn.attention
    (qkv(2, 4, 4, 17, 17, 32), dict()),
    (qkv(2, 4, 2, 17, 33, 64, layout="bshd"), dict(is_causal=True)),
    (qkv(1, 4, 1, 33, 17, 16, layout="strided"), dict(is_causal=True, causal_bottom_right=True)),
    (qkv(1, 2, 2, 9, 9, 128), dict(scale=0.3, impl="naive")),
]


@pytest.mark.parametrize("case", range(len(OPCHECK_CASES)))
def test_opcheck(case):
    args, kwargs = OPCHECK_CASES[case]
    torch.library.opcheck(torch.ops.fattn.attention.default, args, kwargs)


def test_fake_tensor_strides_match_eager():
    from torch._subclasses.fake_tensor import FakeTensorMode
    for layout in ("bhsd", "bshd", "strided"):
        q, k, v = qkv(2, 4, 2, 17, 33, 64, layout=layout)
        out, lse = torch.ops.fattn.attention(q, k, v)
        with FakeTensorMode() as mode:
            fq, fk, fv = (mode.from_tensor(x) for x in (q, k, v))
            fout, flse = torch.ops.fattn.attention(fq, fk, fv)
        assert fout.shape == out.shape and fout.stride() == out.stride(), layout
        assert flse.shape == lse.shape and flse.stride() == lse.stride()


class Block(torch.nn.Module):
    """A small attention block: projections around fattn, as a model would call it."""

    def __init__(self, dim=128, heads=4, kv_heads=2):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, dim // heads
        self.q = torch.nn.Linear(dim, dim)
        self.kv = torch.nn.Linear(dim, 2 * kv_heads * self.head_dim)
        self.o = torch.nn.Linear(dim, dim)

    def forward(self, x, attend=fattn.scaled_dot_product_attention):
        b, s, _ = x.shape
        q = self.q(x).view(b, s, self.heads, self.head_dim).transpose(1, 2)
        k, v = self.kv(x).view(b, s, 2, self.kv_heads, self.head_dim).unbind(2)
        k, v = k.transpose(1, 2), v.transpose(1, 2)  # strided views, passed without copies
        y = attend(q, k, v, is_causal=True, enable_gqa=True)
        return self.o(y.transpose(1, 2).reshape(b, s, -1))


def _graph_ops(model, *inputs, dynamic=False):
    """Compiles with fullgraph=True through a backend that records the FX graph."""
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    torch._dynamo.reset()
    compiled = torch.compile(model, backend=backend, fullgraph=True, dynamic=dynamic)
    out = compiled(*inputs)
    # dynamo records the call as written: the packet torch.ops.fattn.attention
    targets = [getattr(n.target, "_qualified_op_name", n.target)
               for g in graphs for n in g.graph.nodes if n.op == "call_function"]
    return out, targets


@pytest.mark.parametrize("dynamic", [False, True])
def test_compile_traces_the_operator(dynamic):
    torch.manual_seed(0)
    model = Block().eval()
    x = randn(2, 40, 128, seed=3)
    with torch.no_grad():
        eager = model(x)
        out, targets = _graph_ops(model, x, dynamic=dynamic)
        assert "fattn::attention" in targets  # one graph, no graph break
        assert torch.equal(out, eager)
        expected = model(x, attend=F.scaled_dot_product_attention)
    assert (eager - expected).abs().max() < 1e-4


def test_compile_inductor_fullgraph():
    # the default backend (inductor) around the operator: one compile of ~30 s
    torch.manual_seed(0)
    model = Block().eval()
    x = randn(2, 40, 128, seed=4)
    torch._dynamo.reset()
    compiled = torch.compile(model, fullgraph=True)
    with torch.no_grad():
        out = compiled(x)
        eager = model(x)
        x2 = randn(2, 40, 128, seed=5)  # a second call reuses the compiled graph
        out2, eager2 = compiled(x2), model(x2)
    assert (out - eager).abs().max() < 1e-5
    assert (out2 - eager2).abs().max() < 1e-5


def test_compile_flash_attention_and_forward():
    def f(q, k, v):
        a = fattn.flash_attention(q, k, v, causal=True)
        b = fattn.attention_forward(q.transpose(1, 2).contiguous(), k.transpose(1, 2).contiguous(),
                                    v.transpose(1, 2).contiguous())
        return a, b

    q, k, v = randn(1, 24, 2, 32, seed=1), randn(1, 24, 2, 32, seed=2), randn(1, 24, 2, 32, seed=3)
    (a, b), targets = _graph_ops(f, q, k, v)
    assert targets.count("fattn::attention") == 2
    ref_a, _ = reference(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), "bottom_right")
    assert_close_to_reference(a.transpose(1, 2), ref_a)
    assert_close_to_reference(b, reference(q.transpose(1, 2), k.transpose(1, 2),
                                           v.transpose(1, 2))[0])


def test_compile_reports_unsupported_arguments():
    q, k, v = qkv(1, 2, 2, 8, 8, 32)
    torch._dynamo.reset()
    f = torch.compile(lambda q, k, v: fattn.scaled_dot_product_attention(q, k, v, dropout_p=1.5),
                      backend="eager", fullgraph=True)
    with pytest.raises(Exception, match=r"dropout_p must be in \[0, 1\)"):
        f(q, k, v)
