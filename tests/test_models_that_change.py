"""A model whose modules change after its first switch is switched as it is now: layers appended, inserted or
replaced are switched, a module it no longer has is not; a model moved to another attention implementation (one
registered inside a global switch's block included) stays switched, whatever another model's switch in another
thread does meanwhile; attention a module of a switched model computes outside transformers' interface is refused
with the module's path, decided by watching the model's first switched forward (and its first after a change),
never by the names in its config."""

import copy
import threading

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from conftest import VOCAB, batch_for, tiny
from transformers import MixtralConfig, MixtralForCausalLM, PretrainedConfig, PreTrainedModel
from transformers.models.llama.modeling_llama import LlamaAttention

import attnswitch
from attnswitch.errors import UnsupportedModel


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


# -- a model moved to another attention implementation after its switch ------------------------------------

def test_a_patched_model_given_another_attn_implementation_is_switched_as_it_is_now(spy):
    # docs/promises.md, "A model that changes after a switch is switched as it is now", and patch()'s "until
    # unpatch(model)". A model loaded with attn_implementation="eager", patched, then moved to SDPA by the user
    # runs the patched backend in both layers: the patch follows the attention key its config names now, not the
    # one it named when the patch was made. A wrong answer would raise UnsupportedModel "LlamaForCausalLM computes
    # attention outside transformers' attention interface, where no attnswitch backend reaches it, so the switch
    # would leave it as it is: model.layers.0.self_attn (LlamaAttention): scaled_dot_product_attention; ..." for a
    # model that computes nothing itself.
    m = tiny("llama")
    batch = batch_for(m)
    m.set_attn_implementation("eager")
    attnswitch.patch(m, "math")
    try:
        m.set_attn_implementation("sdpa")
        with torch.no_grad():
            m(**batch)
        assert spy.names == ["math", "math"]
    finally:
        attnswitch.unpatch(m)


def test_a_patched_model_moved_to_sdpa_stays_switched_when_another_models_switch_ends_during_its_forward(spy):
    # docs/promises.md "A model that changes after a switch is switched as it is now" and "Forced means forced".
    # Model a is loaded eager, patched with math, then moved to sdpa; model b (sdpa) runs in another thread inside
    # backend("naive", model=b), which holds the sdpa entries. a's own entries take sdpa whether or not the
    # registries hold it already, so when b's block ends in the middle of a's forward (the last holder of sdpa
    # lets go, the registries are put back), a's layer 1 still runs math. A wrong answer would read
    # spy.names == ['math'] (layer 0 only), layer 1 having run transformers' own sdpa, silently; or, on a's first,
    # watched, forward, raise UnsupportedModel "LlamaForCausalLM computes attention outside transformers' attention
    # interface ...: model.layers.1.self_attn (LlamaAttention): scaled_dot_product_attention" for a model that
    # computes nothing itself.
    a, b = tiny("llama"), tiny("llama")
    batch = batch_for(a)
    a.set_attn_implementation("eager")
    attnswitch.patch(a, "math")
    a.set_attn_implementation("sdpa")
    entered, leave, left = threading.Event(), threading.Event(), threading.Event()

    def server():
        with attnswitch.backend("naive", model=b):
            entered.set()
            leave.wait(10)
        left.set()

    t = threading.Thread(target=server)
    t.start()
    hook = None
    try:
        assert entered.wait(10)
        with torch.no_grad():
            a(**batch)  # watched once, while b's block holds sdpa
        assert spy.names == ["math", "math"]
        spy.calls.clear()

        def end_bs_block(module, args, out):
            leave.set()
            left.wait(10)

        hook = a.model.layers[0].register_forward_hook(end_bs_block)
        with torch.no_grad():
            a(**batch)
    finally:
        if hook is not None:
            hook.remove()
        leave.set()
        t.join(10)
        attnswitch.unpatch(a)
    assert spy.names == ["math", "math"]


def test_a_global_switch_switches_a_model_moved_to_an_attention_function_registered_inside_the_block(spy):
    # backend()'s docstring: without model=, "every transformers model on the attention interface that runs in this
    # thread inside the block is switched", and docs/promises.md "A model that changes after a switch is switched
    # as it is now". A model moved inside the block to an attention function registered there (what transformers
    # does when set_attn_implementation loads a hub kernel: it registers the key then) is switched, as it is with
    # the same key registered before the block. A wrong answer, for a model that makes every call through the
    # interface, would raise
    #   UnsupportedModel: LlamaForCausalLM ran a forward under an attnswitch backend without one attention call
    #   through transformers' attention interface: it computed attention itself, so the switch changed nothing.
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, AttentionMaskInterface

    def mine(*args, **kwargs):
        return sdpa_attention_forward(*args, **kwargs)

    m = tiny("llama")
    batch = batch_for(m)
    key = "user-kernel-mine"
    try:
        with attnswitch.backend("math"):
            with torch.no_grad():
                m(**batch)
            AttentionInterface.register(key, mine)
            AttentionMaskInterface.register(key, ALL_MASK_ATTENTION_FUNCTIONS["sdpa"])
            m.set_attn_implementation(key)
            spy.calls.clear()
            try:
                with torch.no_grad():
                    m(**batch)
            except UnsupportedModel as e:
                pytest.fail(f"refused: {e}")
    finally:
        m.set_attn_implementation("sdpa")
        AttentionInterface._global_mapping.pop(key, None)
        AttentionMaskInterface._global_mapping.pop(key, None)
    assert spy.names == ["math", "math"]
