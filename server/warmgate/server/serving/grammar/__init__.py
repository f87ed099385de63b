"""Structured output: grammars (JSON schema, regex, EBNF) compiled by xgrammar, one matcher per
request, and the per-step token bitmask the runner applies to the logits before sampling."""
