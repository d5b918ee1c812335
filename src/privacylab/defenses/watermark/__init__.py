"""Ownership watermarks against model stealing (seed 004, "Mitigating Model Extraction:
Watermarking"; Adi et al. 2018, "Turning Your Weakness Into a Strength: Watermarking Deep
Neural Networks by Backdooring").

The owner trains the model on a secret trigger set — abstract inputs with labels drawn uniformly
at random (`trigger`) — so that it predicts those labels (`embed`); later it claims a suspect
model when the suspect predicts more of them than an independent model plausibly could: an
exact one-sided binomial test (`verify`).
"""

from privacylab.defenses.watermark.embed import (
    BASELINE_FOLDER,
    DEFAULT_TRIGGER_FRACTION,
    Watermarked,
    embed_watermark,
    trigger_copies,
    watermark_job,
)
from privacylab.defenses.watermark.trigger import (
    TRIGGER_KINDS,
    TriggerSet,
    WatermarkError,
    has_trigger_set,
    load_trigger_set,
    make_trigger_set,
    save_trigger_set,
)
from privacylab.defenses.watermark.verify import (
    DEFAULT_THRESHOLD,
    Verification,
    binomial_p_value,
    verify_watermark,
)

__all__ = [
    "BASELINE_FOLDER",
    "DEFAULT_THRESHOLD",
    "DEFAULT_TRIGGER_FRACTION",
    "TRIGGER_KINDS",
    "TriggerSet",
    "Verification",
    "WatermarkError",
    "Watermarked",
    "binomial_p_value",
    "embed_watermark",
    "has_trigger_set",
    "load_trigger_set",
    "make_trigger_set",
    "save_trigger_set",
    "trigger_copies",
    "verify_watermark",
    "watermark_job",
]
