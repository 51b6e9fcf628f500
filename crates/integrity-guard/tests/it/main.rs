//! Integration tests of `integrity-guard`: the rules scored on the committed corpus.

mod corpus;
