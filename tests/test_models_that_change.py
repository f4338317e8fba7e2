"""A model whose modules change after its first switch is switched as it is now: layers appended, inserted or
replaced are switched, a module it no longer has is not; attention a module of a switched model computes
outside transformers' interface is refused with the module's path, decided by watching the model's first
switched forward (and its first after a change), never by the names in its config."""

import copy

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import VOCAB, batch_for, tiny
from transformers import MixtralConfig, MixtralForCausalLM, PretrainedConfig, PreTrainedModel
from transformers.models.llama.modeling_llama import LlamaAttention

import attnswitch


def _forward(m, b):
    with torch.no_grad():
        return m(**b, use_cache=False).logits


def _switched_once(m, b, spy):
    with attnswitch.backend("naive", model=m):
        _forward(m, b)
    assert spy.names == ["naive", "naive"]
    spy.calls.clear()


@pytest.mark.parametrize("how", ["append", "insert", "replace attention"])
@pytest.mark.parametrize("switch", ["context", "patch"])
def test_modules_added_after_the_first_switch_are_switched(how, switch, spy):
    m = tiny("llama")
    b = batch_for(m)
    _switched_once(m, b, spy)
    layers = m.model.layers
    if how == "replace attention":
        layers[1].self_attn = LlamaAttention(m.config, 1)
        calls = 2
    else:  # depth up-scaling: a copy of the last layer (insert writes ModuleList._modules, no hook sees it)
        new = copy.deepcopy(layers[-1])
        new.self_attn.layer_idx = 2
        layers.append(new) if how == "append" else layers.insert(0, new)
        m.config.num_hidden_layers = calls = 3
    if switch == "context":
        with attnswitch.backend("naive", model=m):
            _forward(m, b)
    else:
        attnswitch.patch(m, "naive")
        try:
            _forward(m, b)
        finally:
            attnswitch.unpatch(m)
    assert spy.names == ["naive"] * calls


def test_a_module_the_model_no_longer_has_is_not_switched_with_it(spy):
    m, other = tiny("llama"), tiny("llama")
    b = batch_for(m)
    _switched_once(m, b, spy)
    taken = m.model.layers[1].self_attn
    m.model.layers[1].self_attn = LlamaAttention(m.config, 1)
    other.model.layers[1].self_attn = taken  # now another model's
    with attnswitch.backend("naive", model=m):
        _forward(m, b)
        assert spy.names == ["naive", "naive"]
        want = _forward(other, b)  # not named: not one call of it switched
    assert spy.names == ["naive", "naive"]
    assert torch.equal(want, _forward(other, b))


# -- attention outside the interface ------------------------------------------------------------------

class HeadsConfig(PretrainedConfig):
    """A config that names its head count as remote-code models do (``n_heads``), or not at all."""

    model_type = "attnswitch-test-heads"

    def __init__(self, hidden_size=32, n_heads=None, **kw):
        super().__init__(**kw)
        self.hidden_size = hidden_size
        if n_heads is not None:
            self.n_heads = n_heads


class SdpaMixer(nn.Module):
    def __init__(self, config):
        super().__init__()
        self.qkv = nn.Linear(config.hidden_size, 3 * config.hidden_size)
        self.heads = getattr(config, "n_heads", 4)

    def qkv_heads(self, x):
        b, s, _ = x.shape
        return self.qkv(x).view(b, s, 3, self.heads, -1).permute(2, 0, 3, 1, 4)

    def forward(self, x):
        q, k, v = self.qkv_heads(x)
        return F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).flatten(2)


class WrittenOutMixer(SdpaMixer):
    """softmax(q @ kᵀ) written out, beside a router (softmax over a linear layer's output: not attention)."""

    def __init__(self, config):
        super().__init__(config)
        self.router = nn.Linear(config.hidden_size, 4)

    def forward(self, x):
        weights = torch.softmax(self.router(x), dim=-1)  # 3-d, [b, s, experts]
        q, k, v = self.qkv_heads(x)
        scores = torch.matmul(q, k.transpose(-1, -2)) / q.shape[-1] ** 0.5
        scores = scores.masked_fill(torch.ones(q.shape[2], q.shape[2], dtype=torch.bool).triu(1), float("-inf"))
        out = torch.softmax(scores.float(), dim=-1).to(q.dtype) @ v
        return out.transpose(1, 2).flatten(2) * weights[..., :1]


class RoutedOnly(SdpaMixer):
    def forward(self, x):
        return x * torch.softmax(self.qkv(x), dim=-1)[..., : x.shape[-1]]


class Remote(PreTrainedModel):
    config_class = HeadsConfig
    mixer_class = SdpaMixer

    def __init__(self, config):
        super().__init__(config)
        self.embed, self.mixer = nn.Embedding(VOCAB, config.hidden_size), self.mixer_class(config)
        self.post_init()

    def forward(self, input_ids):
        return self.mixer(self.embed(input_ids))


@pytest.mark.parametrize("mixer, what", [(SdpaMixer, "scaled_dot_product_attention"),
                                         (WrittenOutMixer, r"softmax over q @ kᵀ")])
@pytest.mark.parametrize("heads", ["n_heads", "none"])
def test_attention_outside_the_interface_is_refused_with_the_modules_path(mixer, what, heads):
    cls = type(f"Remote{mixer.__name__}", (Remote,), {"mixer_class": mixer})
    m = cls(HeadsConfig(n_heads=4 if heads == "n_heads" else None)).eval()
    ids = torch.randint(0, VOCAB, (1, 8))
    with torch.no_grad(), pytest.raises(attnswitch.UnsupportedModel, match=rf"mixer \({mixer.__name__}\): {what}"):
        with attnswitch.backend("naive", model=m):
            m(ids)
    with torch.no_grad(), pytest.raises(attnswitch.UnsupportedModel, match="mixer"):
        with attnswitch.backend("naive"):
            m(ids)  # refused again: a refusal is not kept as a verdict


def test_a_model_with_no_attention_and_a_router_softmax_runs():
    m = type("RemoteRouted", (Remote,), {"mixer_class": RoutedOnly})(HeadsConfig()).eval()
    ids = torch.randint(0, VOCAB, (1, 8))
    with torch.no_grad(), attnswitch.backend("naive", model=m):
        m(ids)


def test_a_layer_replaced_by_one_computing_attention_itself_is_refused_at_the_next_forward(spy):
    m = tiny("llama")
    b = batch_for(m)
    _switched_once(m, b, spy)  # watched, and found clean

    class Itself(LlamaAttention):
        def forward(self, hidden_states, position_embeddings, attention_mask=None, **kwargs):
            b_, s, _ = hidden_states.shape
            q = self.q_proj(hidden_states).view(b_, s, -1, self.head_dim).transpose(1, 2)
            k = self.k_proj(hidden_states).view(b_, s, -1, self.head_dim).transpose(1, 2)
            v = self.v_proj(hidden_states).view(b_, s, -1, self.head_dim).transpose(1, 2)
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=attention_mask, enable_gqa=True)
            return self.o_proj(out.transpose(1, 2).reshape(b_, s, -1)), None

    m.model.layers[1].self_attn = Itself(m.config, 1)
    with pytest.raises(attnswitch.UnsupportedModel, match=r"model\.layers\.1\.self_attn \(Itself\)"):
        with attnswitch.backend("naive", model=m):
            _forward(m, b)


def test_a_mixture_of_experts_model_is_switched_with_its_routers_softmax():
    torch.manual_seed(0)
    m = MixtralForCausalLM(MixtralConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
                                         num_experts_per_tok=2)).eval()
    b = batch_for(m)
    with torch.no_grad():
        want = m(**b).logits
        with attnswitch.backend("naive", model=m):
            got = m(**b).logits
    valid = b["attention_mask"].bool()
    torch.testing.assert_close(got[valid], want[valid], rtol=1e-4, atol=1e-4)
