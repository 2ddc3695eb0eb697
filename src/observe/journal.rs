//! gridd log parser.
