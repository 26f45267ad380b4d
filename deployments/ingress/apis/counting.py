"""Every API's declaration of how the keys' limits count its routes (each API's `counting.py`, a
plain table that imports no route; `limits.counting` says what each kind means), gathered in
`ROUTES`, which the builder (`ingress/deployment.py`) hands to the `Limiter`: the limits import no
API. An API with a route that reaches a model or writes state adds its table here;
tests/unit/ingress/limits/test_counting.py fails for any such route of the app without one.
"""

from deployments.ingress.apis.batches.counting import COUNTING as BATCHES
from deployments.ingress.apis.chat.counting import COUNTING as CHAT
from deployments.ingress.apis.completions.counting import COUNTING as COMPLETIONS
from deployments.ingress.apis.conversations.counting import COUNTING as CONVERSATIONS
from deployments.ingress.apis.embeddings.counting import COUNTING as EMBEDDINGS
from deployments.ingress.apis.files.counting import COUNTING as FILES
from deployments.ingress.apis.messages.counting import COUNTING as MESSAGES
from deployments.ingress.apis.responses.counting import COUNTING as RESPONSES
from deployments.ingress.apis.tokenize.counting import COUNTING as TOKENIZE
from deployments.ingress.limits.counting import CountingTable

ROUTES = CountingTable(
    [*CHAT, *COMPLETIONS, *EMBEDDINGS, *MESSAGES, *RESPONSES, *TOKENIZE, *CONVERSATIONS, *FILES, *BATCHES]
)
