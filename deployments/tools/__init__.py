"""Tool calling, for the ingress and the engines alike: `plan` (what a request's tools and tool choice
make of its generation), `prompt` (the generic format's prompt and a template's format), `formats`
(each tool-call format's markers and reader), the readers `regions` (JSON forms) and `pythonic`,
`partial_json` (JSON read as it streams), and `calls` (a choice's text split into content and
streamed tool-call deltas).
"""
