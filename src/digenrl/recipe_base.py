"""The data types of the peer recipe tables (``digenrl.recipes``, ``digenrl.recipe_algorithms``) and the
helpers both use: a recipe is a preset's peer values, each with its source."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# Where the values were read (repository @ commit). Flow-GRPO's configs are its config/grpo.py at 54809b5f (the
# commit docs/from_flow_grpo.md reads too); its training scripts at the commits that hold them.
SOURCES = {
    "flow_grpo": "yifan123/flow_grpo@54809b5f (config/), @ac4c86e8 (scripts/train_sd3.py, flow_grpo/ema.py, "
                 "flow_grpo/stat_tracking.py), @74db6919 (scripts/train_flux.py, scripts/train_wan2_1.py)",
    "flow_grpo_qwen": "scripts/train_qwenimage.py and flow_grpo/diffusers_patch/qwenimage_pipeline_with_logprob.py "
                      "as published in the fork zhtmike/flow_grpo@27b6ef88 / @4b13ec7e (the upstream copy is not in "
                      "the index searched)",
    "dancegrpo": "XueZeyue/DanceGRPO@15cc71d5 (scripts/finetune/finetune_hunyuan_grpo.sh, "
                 "fastvideo/train_grpo_hunyuan.py)",
    "diffusionnft": "NVlabs/DiffusionNFT@24af5554 (config/nft.py, config/base.py, scripts/train_nft_sd3.py, "
                    "flow_grpo/stat_tracking.py, flow_grpo/ema.py, flow_grpo/pickscore_scorer.py)",
    "mixgrpo": "Tencent-Hunyuan/MixGRPO@e5cdd6a4 (scripts/finetune/finetune_flux_grpo_MixGRPO{,_Flash}.sh, "
               "fastvideo/train_grpo_flux.py, fastvideo/utils/{grpo_states,sampling_utils}.py)",
}

_FAMILY_LORA_TARGETS = {  # the scripts' LoraConfig target_modules (= models.lora.FAMILY_TARGETS, checked in a test)
    "sd3": ["attn.add_k_proj", "attn.add_q_proj", "attn.add_v_proj", "attn.to_add_out",
            "attn.to_k", "attn.to_out.0", "attn.to_q", "attn.to_v"],
    "flux": ["attn.to_k", "attn.to_q", "attn.to_v", "attn.to_out.0", "attn.add_k_proj", "attn.add_q_proj",
             "attn.add_v_proj", "attn.to_add_out", "ff.net.0.proj", "ff.net.2", "ff_context.net.0.proj",
             "ff_context.net.2"],
    "wan": ["add_k_proj", "add_q_proj", "add_v_proj", "to_add_out", "to_k", "to_out.0", "to_q", "to_v"],
    "qwen_image": ["attn.to_k", "attn.to_q", "attn.to_v", "attn.to_out.0", "attn.add_k_proj", "attn.add_q_proj",
                   "attn.add_v_proj", "attn.to_add_out", "img_mlp.net.0.proj", "img_mlp.net.2",
                   "txt_mlp.net.0.proj", "txt_mlp.net.2"],
}  # fmt: skip


@dataclass(frozen=True)
class PeerValue:
    key: str  # DigenRL dotted key ("reward" = {name: weight}; "reward.<name>.<option>"; "model.options.<x>")
    value: Any  # the peer's value in DigenRL's terms
    peer: str  # the peer's own setting, as written there
    source: str  # file (and config function) in the peer repository


@dataclass(frozen=True)
class Recipe:
    preset: str  # configs/<preset>.yaml
    title: str  # e.g. "Flow-GRPO pickscore_sd3"
    sources: str  # SOURCES entry (repository @ commit)
    values: tuple[PeerValue, ...]
    quirks: tuple[str, ...] = ()


_v = PeerValue  # _v(key, value, peer, source): one entry of a recipe table


def _merge(entries: list[PeerValue]) -> tuple[PeerValue, ...]:
    """The entries in order, a later entry for the same key replacing the earlier one (a config's own value
    over config/base.py's)."""
    out: dict[str, PeerValue] = {}
    for e in entries:
        out.pop(e.key, None)
        out[e.key] = e
    return tuple(out.values())


def _adamw(src: str) -> list[PeerValue]:
    """The optimizer of Flow-GRPO's ``config/base.py`` (DiffusionNFT's copy of it has the same values)."""
    return [
        _v("train.lr", 3e-4, "train.learning_rate = 3e-4", src),
        _v("train.betas", (0.9, 0.999), "train.adam_beta1 = 0.9, adam_beta2 = 0.999", src),
        _v("train.weight_decay", 1e-4, "train.adam_weight_decay = 1e-4", src),
        _v("train.adam_epsilon", 1e-8, "train.adam_epsilon = 1e-8", src),
        _v("train.max_grad_norm", 1.0, "train.max_grad_norm = 1.0", src),
    ]


def _ema(cfg: str, script: str, every: int) -> list[PeerValue]:
    """``train.ema = True`` in ``cfg`` with ``flow_grpo/ema.py``'s EMAModuleWrapper, stepped every ``every``."""
    return [
        _v("train.ema_decay", 0.9, "train.ema = True; EMAModuleWrapper(decay=0.9, ...)", f"{cfg}, {script}"),
        _v("train.ema_every", every, f"EMAModuleWrapper(..., update_step_interval={every})", script),
        _v("train.ema_warmup", True, "decay_n = min((1 + n) / (10 + n), decay)", "flow_grpo/ema.py"),
    ]


def _fastvideo_grpo(sh: str, py: str, clip: list[PeerValue]) -> list[PeerValue]:
    """The AdamW and group-advantage settings of DanceGRPO's fastvideo trainers, which MixGRPO's fork keeps;
    ``clip``: the two clip entries between them (their flags differ)."""
    return [
        _v("train.lr", 1e-5, "--learning_rate 1e-5 (--lr_warmup_steps 0: constant)", sh),
        _v("train.weight_decay", 1e-4, "--weight_decay 0.0001", sh),
        _v("train.betas", (0.9, 0.999), "AdamW(betas=(0.9, 0.999))", py),
        _v("train.adam_epsilon", 1e-8, "AdamW(eps=1e-8)", py),
        _v("train.max_grad_norm", 1.0, "--max_grad_norm 1.0", sh),
        *clip,
        _v("train.std_mode", "group", "--use_group: group_rewards.std()", sh),
        _v("train.adv_baseline", "group", "--use_group: group_rewards.mean()", sh),
        _v("train.adv_std_unbiased", True, "torch .std() (n - 1)", py),
        _v("train.adv_eps", 1e-8, "group_rewards.std() + 1e-8", py),
    ]


def _lora(family: str, rank: int, alpha: int, script: str) -> list[PeerValue]:
    return [
        _v("model.lora.rank", rank, f"LoraConfig(r={rank}, ...)", script),
        _v("model.lora.alpha", alpha, f"LoraConfig(lora_alpha={alpha}, ...)", script),
        _v("model.lora.target_modules", _FAMILY_LORA_TARGETS[family], "LoraConfig(target_modules=[...])", script),
    ]
