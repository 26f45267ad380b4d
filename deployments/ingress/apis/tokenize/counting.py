"""How the keys' limits count /tokenize and /detokenize (`limits.counting`): the decoder's tokenizer, no generation."""

from deployments.ingress.limits.counting import Counted, RouteCounting

COUNTING = (
    RouteCounting("POST", "/tokenize", Counted.NAMES_A_MODEL),
    RouteCounting("POST", "/detokenize", Counted.NAMES_A_MODEL),
)
