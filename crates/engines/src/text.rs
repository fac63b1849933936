//! Text shared by every error message: [`quote`] is the one way a message quotes an input value, so
//! no message echoes more than [`QUOTE_BYTES`] bytes of anything a client or a file supplied (a huge
//! value would otherwise make the message itself too large to send as a gRPC status).

/// Most bytes of an input value an error message quotes.
pub const QUOTE_BYTES: usize = 64;

/// An input value for an error message: Debug-quoted, cut to at most [`QUOTE_BYTES`] bytes of the
/// value (at a character boundary) with its full length noted when cut. Error messages never echo
/// more of any input than this.
pub fn quote(value: &str) -> String {
    if value.len() <= QUOTE_BYTES {
        return format!("{value:?}");
    }
    let mut end = QUOTE_BYTES;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    format!("{:?}... ({} bytes)", &value[..end], value.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quote_cuts_long_values_at_a_char_boundary() {
        assert_eq!(quote("poi"), "\"poi\"");
        let long = "é".repeat(5000);
        let q = quote(&long);
        assert!(q.len() < QUOTE_BYTES + 40, "{q}");
        assert!(q.ends_with("(10000 bytes)"), "{q}");
    }
}
