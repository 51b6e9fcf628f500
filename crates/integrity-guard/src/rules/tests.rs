//! Rule compilation and matching.
