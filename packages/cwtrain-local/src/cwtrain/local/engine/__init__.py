"""The engine stand-in: replicas that apply snapshots and serve a small model, and the gateway.

``replica`` (one engine process: snapshot fetch, verification and swap, the vLLM-shaped HTTP
endpoint), ``snapshots`` (fetching and replaying snapshots with core's decoder), ``processes``
(starting and stopping replica processes), ``model`` (the tiny causal LM), ``completions``,
``chat``, ``tokenization`` and ``tokenizer`` (vLLM's request and answer shapes), and
``gateway`` (the OpenAI-compatible front that spreads requests over the replicas).
"""
