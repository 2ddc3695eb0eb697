//! nvidia-smi parser.
