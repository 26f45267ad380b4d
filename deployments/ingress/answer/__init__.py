"""The answer core that every endpoint's service uses, so that an API only frames an answer: `core`
(one served model's decoder, deadline, sampling settings and vision pipeline), `stream` (the
decoder's chunks before the deadline, an answer's streams read as one), `choices` (how each choice
ended and the usage of them all), `reply` (the loops that feed an answer's chunks to its framing,
whole or streamed, and what a route sends)."""
