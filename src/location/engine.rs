//! CliqueCloak search (to be written).
