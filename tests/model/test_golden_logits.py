"""Golden logits: learned positions' (the default's) arithmetic pinned to numbers recorded from the code
as it was (the refactor of post-training into ``training/tasks``). Other tests compare two paths of
today's code, which a change that moves both alike passes; this one fails if a refactor changed what a
trained model computes: find out why before recording new numbers. The weights are drawn per tensor,
seeded by its name, so a new parameter or another order of initialisation changes nothing here."""

import zlib

import torch

from model.config import GPTConfig
from model.gpt import GPT

# The shape of configs/tiny.yaml's family, small: grouped-query attention, a narrow SwiGLU, value
# embeddings, learned positions, tied embeddings.
CONFIG = dict(vocab_size=64, block_size=16, n_layer=2, n_head=4, n_kv_head=2, n_embd=32, ffn_hidden=48,
              value_embeddings=True)
IDS = [5, 17, 3, 42, 8, 63, 0, 29, 11, 50]

# logits[0, t, :6] for each of the 10 positions, then logsumexp(logits[0, t]) (which reads every
# logit), recorded from the code at the time of writing.
FIRST_SIX = [
    [0.29547, 0.5008923, 1.1820862, -0.5060357, 1.0623449, 0.5851441],
    [0.0873666, 0.1293393, 0.7417229, -0.1036938, 1.1105072, -0.5493588],
    [0.4896575, 1.4348853, 0.0181136, 1.8272303, 1.191739, 0.2474366],
    [-0.2720942, 0.9636319, 0.2226274, 0.7357944, 1.1264322, -0.160443],
    [-0.0967623, 1.0525517, 0.3154526, 0.5886915, 0.9859799, 0.4380575],
    [-0.0980005, 0.612878, -0.1318521, 1.1242501, 0.6585249, 0.131138],
    [0.6043987, 0.4493284, -0.0793012, 0.6991139, 0.5809165, -0.1237216],
    [-0.3964547, 0.2257716, 0.8664164, -0.7788206, 0.6718355, -0.2611868],
    [-0.6862389, 0.7130445, 0.5626586, -0.2189485, 0.5167785, -0.6268626],
    [-0.1153276, 0.0994498, -0.2145107, -0.5978594, 0.3959762, 0.5355084],
]
LOGSUMEXP = [4.3929057, 4.3605933, 4.5359778, 4.4303269, 4.391582, 4.3267174, 4.3280439, 4.3661728, 4.280653,
             4.2803173]
TOLERANCE = dict(rtol=0, atol=5e-6)  # the numbers are rounded to 1e-7; float32 sums differ by less than this


def golden_model() -> GPT:
    """The model with every tensor drawn from a generator seeded by its name (norm gains about 1)."""
    model = GPT(GPTConfig(**CONFIG)).eval()
    with torch.no_grad():
        for name, tensor in sorted(model.state_dict().items()):
            generator = torch.Generator().manual_seed(zlib.crc32(name.encode()))
            centre = 1.0 if name.endswith("norm.weight") else 0.0
            tensor.copy_(centre + 0.1 * torch.randn(tensor.shape, generator=generator))
    return model


def test_learned_positions_compute_the_recorded_logits_with_and_without_the_cache():
    model = golden_model()
    assert model.config.positions == "learned"  # the default this test pins
    ids = torch.tensor([IDS])
    with torch.no_grad():
        logits = model(ids)[0]
    torch.testing.assert_close(logits[:, :6], torch.tensor(FIRST_SIX), **TOLERANCE)
    torch.testing.assert_close(torch.logsumexp(logits, -1), torch.tensor(LOGSUMEXP), **TOLERANCE)
    # The cache path adds each new token's position from the cache's length: the last token, decoded
    # after the others were prefilled, must read the table at position 9 as the full pass does.
    with torch.no_grad():
        cache = model.init_cache(1)
        model(ids[:, :-1], cache=cache)
        last = model(ids[:, -1:], cache=cache)[0, -1]
    torch.testing.assert_close(last[:6], torch.tensor(FIRST_SIX[-1]), **TOLERANCE)
    torch.testing.assert_close(torch.logsumexp(last, -1), torch.tensor(LOGSUMEXP[-1]), **TOLERANCE)
