"""The answer core that every API's service uses, so that an API only formats an answer: `core`
(one served model's decoder, deadline, sampling settings and vision pipeline, and the opening of an
answer, written once), `stream` (the decoder's chunks before the deadline, an answer's streams read
as one), `events` (one answer as semantic events: began, logprobs, text, tool call, ended), `tally`
(how each choice ended and the usage of them all), `reply` (the one loop that feeds an answer's
chunks to an API's formatter, whole or streamed, the framing of a stream's errors and end, and what
a route sends).
"""
