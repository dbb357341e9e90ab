"""Head drafters read from the formats people deploy: EAGLE-1/2, EAGLE-3 (EAGLE/SpecForge
export and speculators), Medusa (FasterDecoding and vLLM) and a target's own MTP layers
(DeepSeek-V3/GLM-4.5, Qwen3-Next, MiMo).

Specs:  eagle3:PATH | eagle:PATH | medusa:PATH   a head of that kind (checked against its files)
        PATH                                     any head, recognised from its files
        mtp                                      the target's own MTP layers

`detect` reads config.json and tensor headers only; `head_info` gives `check` what it
needs without a weight; `build_head` loads the modules over a loaded target.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

from specprobe.core.errors import ModelLoadError
from specprobe.drafters.base import ModelInfo
from specprobe.models.heads.eagle import (
    Eagle1Drafter,
    Eagle3Drafter,
    describe_eagle1,
    describe_eagle3,
)
from specprobe.models.heads.files import MEDUSA_FILE, open_folder, read_config
from specprobe.models.heads.layout import HEAD_KINDS, MTP_SPEC, HeadLayout, missing_head, split_spec
from specprobe.models.heads.medusa import MedusaDrafter, describe_medusa
from specprobe.models.heads.mtp import MTPDrafter, describe_mtp
from specprobe.models.hub import snapshot_repo

__all__ = ["HEAD_KINDS", "HeadLayout", "build_head", "detect", "head_info", "head_kind"]

_LABEL = {"eagle": "an EAGLE-1/2 head", "eagle3": "an EAGLE-3 head", "medusa": "Medusa heads"}


def _folder(path_text: str) -> Path | None:
    p = Path(path_text).expanduser()
    if p.is_file() and p.name in (MEDUSA_FILE, "medusa_lm_head.pt"):
        return p.parent
    return p if p.is_dir() and (p / "config.json").is_file() else None


def _looks_like_head(folder: Path) -> bool:
    """Cheap pre-test on config.json alone, so a plain LM checkpoint is never indexed."""
    try:
        cfg = read_config(folder)
    except ModelLoadError:
        return False
    archs = " ".join(str(a) for a in cfg.get("architectures") or []).lower()
    return bool(
        cfg.get("speculators_model_type")
        or "eagle" in archs
        or "medusa_num_heads" in cfg
        or cfg.get("model_type") == "medusa"
        or (folder / MEDUSA_FILE).is_file()
        or int(cfg.get("num_hidden_layers") or 99) <= 2  # EAGLE-1 heads are 1-layer Llama configs
    )


def _describe(folder: Path, kind: str | None) -> HeadLayout | None:
    files = open_folder(folder)
    order = {"eagle3": (describe_eagle3,), "eagle": (describe_eagle1,), "medusa": (describe_medusa,)}
    for fn in order.get(kind or "", (describe_eagle3, describe_medusa, describe_eagle1)):
        layout = fn(files)
        if layout is not None:
            return layout
    return None


def detect(spec: str, target_info: ModelInfo | None = None) -> HeadLayout | None:
    """The head a drafter spec names, from its files (no weights); None for a spec that
    is not a head (an independent LM or a self-draft). A spec that names a head kind
    but whose files are not that head is an error."""
    kind, rest = split_spec(spec)
    if kind == "mtp":
        if target_info is None:
            raise ModelLoadError("'mtp' needs the target's checkpoint", "give the target first")

        layout = describe_mtp(open_folder(Path(target_info.path)))
        if layout is None:
            raise ModelLoadError(
                f"{target_info.name} has no MTP layers (its config declares no num_nextn_predict_layers / mtp_num_hidden_layers and its files hold none)",
                "use 'mtp' with a target that ships them (DeepSeek-V3/R1, GLM-4.5, Qwen3-Next, MiMo)",
            )
        return layout
    if spec == "self" or spec.startswith("self:"):
        return None
    folder = _folder(rest)
    if kind is not None:
        if folder is None and not Path(rest).expanduser().exists():
            raise missing_head(kind, rest)
        if folder is None:
            raise ModelLoadError(f"{rest} is not a head checkpoint folder (no config.json)", f"pass the folder that holds the head's config.json and weights ({spec.split(':')[0]}:PATH)")
        layout = _describe(folder, kind)
        if layout is None:
            raise ModelLoadError(f"{rest} does not hold {_LABEL[kind]}", "check the path, or drop the prefix to let specprobe recognise the files")
        return layout
    if folder is None or not _looks_like_head(folder):
        return None
    return _describe(folder, None)


def head_kind(spec: str) -> str | None:
    """The head kind a spec names (reads config.json and headers for a bare path)."""
    kind, _ = split_spec(spec)
    if kind is not None:
        return kind
    try:
        layout = detect(spec)
    except ModelLoadError:
        return None
    return layout.kind if layout else None


def head_info(spec: str, target_info: ModelInfo, layout: HeadLayout | None = None) -> ModelInfo | None:
    """A ModelInfo for a head (the target's tokenizer; no generation config of its own,
    since the engine samples a head with the target's settings); None when the spec is
    not a head. `extra["head"]` carries the layout for the head checks."""
    layout = layout or detect(spec, target_info)
    if layout is None:
        return None
    lc = layout.details.get("layer_config") or layout.config
    tvocab = int(getattr(target_info.config, "vocab_size", 0) or 0)
    config = SimpleNamespace(
        vocab_size=layout.vocab_size or tvocab,
        hidden_size=layout.hidden_size,
        max_position_embeddings=lc.get("max_position_embeddings") if layout.kind in ("eagle", "eagle3") else getattr(target_info.config, "max_position_embeddings", None),
        model_type=f"{layout.kind} head",
    )
    # a head in the hub cache is named by its repo, not by the revision hash its folder is called
    name = target_info.name + " MTP" if spec == MTP_SPEC else (snapshot_repo(layout.path) or layout.path.name)
    return ModelInfo(spec, name, layout.path, config, target_info.tokenizer, None, {"head": layout})


def build_head(spec: str, target: Any, info: ModelInfo) -> Any:
    """The head drafter over a loaded target (modules on the target's device and dtype)."""
    layout: HeadLayout = info.extra["head"]
    if layout.kind == "eagle3":
        return Eagle3Drafter(spec, target, info, layout)
    if layout.kind == "eagle":
        return Eagle1Drafter(spec, target, info, layout)
    if layout.kind == "medusa":
        return MedusaDrafter(spec, target, info, layout)

    return MTPDrafter(spec, target, info, layout)
