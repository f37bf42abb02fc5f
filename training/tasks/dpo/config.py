"""The ``dpo:`` section of a run's config (``data.format: preference``): DPO's knobs, as TRL's DPOConfig
names them, with its defaults."""

from pydantic import Field

from training.config import MethodSection, register_section

# β multiplies a difference of log-ratios of summed reply probabilities inside a sigmoid. Published
# settings are 0.01 to 1 (TRL's default 0.1); at 10 a margin of a nat already saturates the sigmoid,
# so the loss counts only the pairs it has wrong; a typo such as 1e300 overflows the rewards, which
# would then be reported as a divergence the learning rate caused.
MAX_BETA = 10.0
# RPO's weight on the chosen replies' NLL: TRL suggests 1; at 10 the NLL outweighs the preference
# term tenfold and the run is supervised fine-tuning on the chosen replies, and past it a typo
# overflows the loss.
MAX_RPO_ALPHA = 10.0


@register_section("dpo")
class DPOConfig(MethodSection):
    """Direct preference optimisation (``training/tasks/dpo/loss.py``) of the ``train.init_from`` run."""

    beta: float = Field(0.1, gt=0, le=MAX_BETA, description="how far the policy may move from init_from")
    rpo_alpha: float = Field(0.0, ge=0, le=MAX_RPO_ALPHA, description="chosen replies' NLL weight; 0: plain DPO")
