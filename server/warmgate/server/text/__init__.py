"""Text around the token-id serving path: the model directory's tokenizer, chat template,
end-of-sequence ids, and the incremental detokenizer that turns a stream's tokens into text."""
