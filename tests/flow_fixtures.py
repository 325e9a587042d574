"""Tiny random CosyVoice3 ``flow.pt`` files in the official key layout (offline, for tests).

The keys and shapes are enumerated here from upstream's module tree (``CausalMaskedDiffWithDiT`` with
``PreLookaheadLayer`` and the DiT estimator, including x-transformers' persistent ``inv_freq`` buffer),
independently of ``specli.tts.acoustic.flow_cv3``. :data:`TINY_FLOW_YAML` is the matching yaml ``flow:``
entry, in the published file's shape.
"""

from __future__ import annotations

import math
import re
from pathlib import Path

import torch

# the flow's settings after ``input_size:``, the same in the CosyVoice2 and CosyVoice3 yaml
FLOW_HEAD_YAML = """\
    output_size: 80
    spk_embed_dim: !ref <spk_embed_dim>
    output_type: 'mel'
    vocab_size: 6561
    input_frame_rate: !ref <token_frame_rate>
    only_mask_loss: True
    token_mel_ratio: !ref <token_mel_ratio>
    pre_lookahead_len: 3
"""

# the flow's ``decoder:`` head (the CFM settings), the same in the CosyVoice2 and CosyVoice3 yaml
CFM_DECODER_YAML = """\
    decoder: !new:cosyvoice.flow.flow_matching.CausalConditionalCFM
        in_channels: 240
        n_spks: 1
        spk_emb_dim: 80
        cfm_params: !new:omegaconf.DictConfig
            content:
                sigma_min: 1e-06
                solver: 'euler'
                t_scheduler: 'cosine'
                training_cfg_rate: 0.2
                inference_cfg_rate: 0.7
                reg_loss_type: 'l1'
"""

TINY = {"dim": 32, "depth": 2, "heads": 2, "dim_head": 16, "ff_mult": 2, "lookahead": 24, "chunk": 8}

TINY_FLOW_YAML = """\
flow: !new:cosyvoice.flow.flow.CausalMaskedDiffWithDiT
    input_size: 80
{flow_head}    pre_lookahead_layer: !new:cosyvoice.transformer.upsample_encoder.PreLookaheadLayer
        in_channels: 80
        channels: {lookahead}
        pre_lookahead_len: 3
{cfm_decoder}        estimator: !new:cosyvoice.flow.DiT.dit.DiT
            dim: {dim}
            depth: {depth}
            heads: {heads}
            dim_head: {dim_head}
            ff_mult: {ff_mult}
            mel_dim: 80
            mu_dim: 80
            spk_dim: 80
            out_channels: 80
            static_chunk_size: {chunk}
            num_decoding_left_chunks: -1
""".format(**TINY, flow_head=FLOW_HEAD_YAML, cfm_decoder=CFM_DECODER_YAML)


def flow_shapes(dim: int, depth: int, heads: int, dim_head: int, ff_mult: int, lookahead: int,
                **_: int) -> dict[str, tuple[int, ...]]:
    """Upstream's ``flow.pt`` keys and shapes for a CosyVoice3 flow of these DiT sizes."""
    inner, est = heads * dim_head, "decoder.estimator."
    shapes: dict[str, tuple[int, ...]] = {
        "input_embedding.weight": (6561, 80),
        "spk_embed_affine_layer.weight": (80, 192), "spk_embed_affine_layer.bias": (80,),
        "pre_lookahead_layer.conv1.weight": (lookahead, 80, 4), "pre_lookahead_layer.conv1.bias": (lookahead,),
        "pre_lookahead_layer.conv2.weight": (80, lookahead, 3), "pre_lookahead_layer.conv2.bias": (80,),
        est + "time_embed.time_mlp.0.weight": (dim, 256), est + "time_embed.time_mlp.0.bias": (dim,),
        est + "time_embed.time_mlp.2.weight": (dim, dim), est + "time_embed.time_mlp.2.bias": (dim,),
        est + "input_embed.proj.weight": (dim, 320), est + "input_embed.proj.bias": (dim,),
        est + "rotary_embed.inv_freq": (dim_head // 2,),
        est + "norm_out.linear.weight": (2 * dim, dim), est + "norm_out.linear.bias": (2 * dim,),
        est + "proj_out.weight": (80, dim), est + "proj_out.bias": (80,),
    }
    for conv in ("conv1", "conv2"):
        shapes[f"{est}input_embed.conv_pos_embed.{conv}.0.weight"] = (dim, dim // 16, 31)
        shapes[f"{est}input_embed.conv_pos_embed.{conv}.0.bias"] = (dim,)
    for i in range(depth):
        blk = f"{est}transformer_blocks.{i}."
        shapes[blk + "attn_norm.linear.weight"] = (6 * dim, dim)
        shapes[blk + "attn_norm.linear.bias"] = (6 * dim,)
        for proj in ("to_q", "to_k", "to_v"):
            shapes[f"{blk}attn.{proj}.weight"] = (inner, dim)
            shapes[f"{blk}attn.{proj}.bias"] = (inner,)
        shapes[blk + "attn.to_out.0.weight"] = (dim, inner)
        shapes[blk + "attn.to_out.0.bias"] = (dim,)
        shapes[blk + "ff.ff.0.0.weight"] = (dim * ff_mult, dim)
        shapes[blk + "ff.ff.0.0.bias"] = (dim * ff_mult,)
        shapes[blk + "ff.ff.2.weight"] = (dim, dim * ff_mult)
        shapes[blk + "ff.ff.2.bias"] = (dim,)
    return shapes


def official_flow_state(seed: int = 0, sizes: dict[str, int] | None = None) -> dict[str, torch.Tensor]:
    """A random CosyVoice3 ``flow.pt`` state dict (tiny sizes unless ``sizes``)."""
    sizes = sizes or TINY
    gen = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for name, shape in flow_shapes(**sizes).items():
        if name.endswith("inv_freq"):
            dh = sizes["dim_head"]
            state[name] = 1.0 / (10000 ** (torch.arange(0, dh, 2).float() / dh))
        elif name == "input_embedding.weight":
            state[name] = torch.randn(shape, generator=gen)
        else:
            fan_in = math.prod(shape[1:]) if len(shape) > 1 else 4
            state[name] = torch.randn(shape, generator=gen) / math.sqrt(fan_in)
    return state


_HIFT_YAML = """\
hift: !new:cosyvoice.hifigan.generator.{cls}
    in_channels: 80
    base_channels: {base}
    nb_harmonics: 8
    sampling_rate: !ref <sample_rate>
    nsf_alpha: 0.1
    nsf_sigma: 0.003
    nsf_voiced_threshold: 10
    upsample_rates: [8, 5, 3]
    upsample_kernel_sizes: [16, 11, 7]
    istft_params:
        n_fft: 16
        hop_len: 4
    resblock_kernel_sizes: [3, 7, 11]
    resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    source_resblock_kernel_sizes: [7, 7, 11]
    source_resblock_dilation_sizes: [[1, 3, 5], [1, 3, 5], [1, 3, 5]]
    lrelu_slope: 0.1
    audio_limit: 0.99
{extra}    f0_predictor: !new:cosyvoice.hifigan.f0_predictor.{f0}
        num_class: 1
        in_channels: 80
        cond_channels: {cond}
"""


def hift_yaml(kind: str, base_channels: int, cond_channels: int) -> str:
    """A yaml ``hift:`` entry of ``kind`` in the published files' shape, with these channel counts."""
    if kind == "cosyvoice3":
        return _HIFT_YAML.format(cls="CausalHiFTGenerator", f0="CausalConvRNNF0Predictor", base=base_channels,
                                 cond=cond_channels, extra="    conv_pre_look_right: 4\n")
    return _HIFT_YAML.format(cls="HiFTGenerator", f0="ConvRNNF0Predictor", base=base_channels, cond=cond_channels,
                             extra="")


TINY_HIFT_YAML = hift_yaml("cosyvoice3", 16, 8)


def write_flow(path: Path, seed: int = 0) -> Path:
    torch.save(official_flow_state(seed), path)
    return path


def write_audio_checkpoint(path: Path, seed: int = 4, boost: int | None = None, kind: str = "cosyvoice3") -> Path:
    """A tiny directory that speaks: F1's LLM checkpoint and official yaml (whose flow and hift entries are the
    tiny ones here), H1's tiny HiFT + ONNX frontends, a tiny flow."""
    from acoustic_fixtures import write_acoustic_dir
    from cosyvoice_fixtures import write_checkpoint

    write_checkpoint(path, kind, seed=seed, boost=boost)
    write_acoustic_dir(path, kind)
    state = official_flow_state(seed) if kind == "cosyvoice3" else official_cv2_flow_state(seed)
    torch.save(state, path / "flow.pt")
    return path


# --- CosyVoice2 (CausalMaskedDiffWithXvec) ----------------------------------------------------------------

TINY_CV2 = {"d": 32, "heads": 2, "units": 48, "blocks": 2, "chunk": 4, "c": 16, "head_dim": 8, "unet_heads": 2,
            "n_blocks": 1, "mid": 2, "unet_chunk": 8}

TINY_CV2_FLOW_YAML = """\
flow: !new:cosyvoice.flow.flow.CausalMaskedDiffWithXvec
    input_size: {d}
{flow_head}    encoder: !new:cosyvoice.transformer.upsample_encoder.UpsampleConformerEncoder
        output_size: {d}
        attention_heads: {heads}
        linear_units: {units}
        num_blocks: {blocks}
        dropout_rate: 0.1
        positional_dropout_rate: 0.1
        attention_dropout_rate: 0.1
        normalize_before: True
        input_layer: 'linear'
        pos_enc_layer_type: 'rel_pos_espnet'
        selfattention_layer_type: 'rel_selfattn'
        input_size: {d}
        use_cnn_module: False
        macaron_style: False
        static_chunk_size: {chunk}
{cfm_decoder}        estimator: !new:cosyvoice.flow.decoder.CausalConditionalDecoder
            in_channels: 320
            out_channels: 80
            channels: [{c}]
            dropout: 0.0
            attention_head_dim: {head_dim}
            n_blocks: {n_blocks}
            num_mid_blocks: {mid}
            num_heads: {unet_heads}
            act_fn: 'gelu'
            static_chunk_size: {unet_chunk}
            num_decoding_left_chunks: -1
""".format(**TINY_CV2, flow_head=FLOW_HEAD_YAML, cfm_decoder=CFM_DECODER_YAML)


Shapes = dict[str, tuple[int, ...]]


def _lin(s: Shapes, name: str, cout: int, cin: int, bias: bool = True) -> None:
    s[name + ".weight"] = (cout, cin)
    if bias:
        s[name + ".bias"] = (cout,)


def _conv(s: Shapes, name: str, cout: int, cin: int, k: int) -> None:
    s[name + ".weight"], s[name + ".bias"] = (cout, cin, k), (cout,)


def _norm(s: Shapes, name: str, n: int) -> None:
    s[name + ".weight"], s[name + ".bias"] = (n,), (n,)


def _cv2_encoder_shapes(s: Shapes, d: int, heads: int, units: int, blocks: int) -> None:
    enc = "encoder."
    for emb in ("embed", "up_embed"):
        _lin(s, f"{enc}{emb}.out.0", d, d)
        _norm(s, f"{enc}{emb}.out.1", d)
    _conv(s, enc + "pre_lookahead_layer.conv1", d, d, 4)
    _conv(s, enc + "pre_lookahead_layer.conv2", d, d, 3)
    _conv(s, enc + "up_layer.conv", d, d, 5)
    _norm(s, enc + "after_norm", d)
    layers = [f"{enc}encoders.{i}." for i in range(blocks)] + [f"{enc}up_encoders.{i}." for i in range(4)]
    for p in layers:
        for name in ("linear_q", "linear_k", "linear_v", "linear_out"):
            _lin(s, p + "self_attn." + name, d, d)
        _lin(s, p + "self_attn.linear_pos", d, d, bias=False)
        s[p + "self_attn.pos_bias_u"] = s[p + "self_attn.pos_bias_v"] = (heads, d // heads)
        _lin(s, p + "feed_forward.w_1", units, d)
        _lin(s, p + "feed_forward.w_2", d, units)
        _norm(s, p + "norm_ff", d)
        _norm(s, p + "norm_mha", d)


def _cv2_unet_shapes(s: Shapes, c: int, head_dim: int, heads: int, n_blocks: int, mid: int) -> None:
    est = "decoder.estimator."
    _lin(s, est + "time_mlp.linear_1", 4 * c, 320)
    _lin(s, est + "time_mlp.linear_2", 4 * c, 4 * c)

    def resnet(p: str, cin: int) -> None:
        _lin(s, p + "mlp.1", c, 4 * c)
        _conv(s, p + "block1.block.0", c, cin, 3)
        _norm(s, p + "block1.block.2", c)
        _conv(s, p + "block2.block.0", c, c, 3)
        _norm(s, p + "block2.block.2", c)
        _conv(s, p + "res_conv", c, cin, 1)

    def transformers(p: str) -> None:
        for j in range(n_blocks):
            q = f"{p}{j}."
            _norm(s, q + "norm1", c)
            _norm(s, q + "norm3", c)
            for name in ("to_q", "to_k", "to_v"):
                _lin(s, q + "attn1." + name, heads * head_dim, c, bias=False)
            _lin(s, q + "attn1.to_out.0", c, heads * head_dim)
            _lin(s, q + "ff.net.0.proj", 4 * c, c)
            _lin(s, q + "ff.net.2", c, 4 * c)

    resnet(est + "down_blocks.0.0.", 320)
    transformers(est + "down_blocks.0.1.")
    _conv(s, est + "down_blocks.0.2", c, c, 3)
    for m in range(mid):
        resnet(f"{est}mid_blocks.{m}.0.", c)
        transformers(f"{est}mid_blocks.{m}.1.")
    resnet(est + "up_blocks.0.0.", 2 * c)
    transformers(est + "up_blocks.0.1.")
    _conv(s, est + "up_blocks.0.2", c, c, 3)
    _conv(s, est + "final_block.block.0", c, c, 3)
    _norm(s, est + "final_block.block.2", c)
    _conv(s, est + "final_proj", 80, c, 1)


def cv2_flow_shapes(d: int, heads: int, units: int, blocks: int, c: int, head_dim: int, unet_heads: int,
                    n_blocks: int, mid: int, **_: int) -> Shapes:
    """Upstream's CosyVoice2 ``flow.pt`` keys and shapes for these sizes."""
    s: Shapes = {"input_embedding.weight": (6561, d), "spk_embed_affine_layer.weight": (80, 192),
                 "spk_embed_affine_layer.bias": (80,), "encoder_proj.weight": (80, d), "encoder_proj.bias": (80,)}
    _cv2_encoder_shapes(s, d, heads, units, blocks)
    _cv2_unet_shapes(s, c, head_dim, unet_heads, n_blocks, mid)
    return s


def official_cv2_flow_state(seed: int = 0, sizes: dict[str, int] | None = None) -> dict[str, torch.Tensor]:
    """A random CosyVoice2 ``flow.pt`` state dict (tiny sizes unless ``sizes``)."""
    gen = torch.Generator().manual_seed(seed)
    state: dict[str, torch.Tensor] = {}
    for name, shape in cv2_flow_shapes(**(sizes or TINY_CV2)).items():
        if re.search(r"norm\w*\.weight$|block\.2\.weight$|out\.1\.weight$", name):
            state[name] = 1 + 0.1 * torch.randn(shape, generator=gen)
        else:
            fan_in = math.prod(shape[1:]) if len(shape) > 1 else 4
            state[name] = torch.randn(shape, generator=gen) / math.sqrt(fan_in)
    return state
