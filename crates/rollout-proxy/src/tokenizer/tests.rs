//! Tests of `tokenizer`.
