"""The learning loop (the DSO seed): experiences extracted from rollouts by an LLM, and an LLM curator.

`extract` and `loop` are clients of a node over its RPC; `curator` runs inside a daemon whose
config enables it. Every model answer is untrusted input: it is parsed tolerantly, checked
against the ledger's own validation, and rejected with a counted reason when it does not pass.
"""
