"""What the document stage and the image pipeline share, below both: fetching a URL behind the SSRF
guard (`fetch`), decoding a data URL (`data_url`), walking a chat's parts and writing it as text
(`chat`), the words for what was not seen (`unseen`), and the bounded cache whose work in flight is
shared (`cache`).
"""
