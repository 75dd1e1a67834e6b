//! Cutting text to a byte bound without splitting a character: every bounded message, error
//! and note goes through here.

/// The longest prefix of `text` that is at most `max` bytes and ends on a character boundary.
pub fn prefix_within(text: &str, max: usize) -> &str {
    let mut end = text.len().min(max);
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    &text[..end]
}

/// `text` cut in place to at most `max` bytes, on a character boundary.
pub fn cut_within(mut text: String, max: usize) -> String {
    let keep = prefix_within(&text, max).len();
    text.truncate(keep);
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cut_never_splits_a_character() {
        assert_eq!(prefix_within("héllo", 2), "h");
        assert_eq!(prefix_within("héllo", 3), "hé");
        assert_eq!(prefix_within("abc", 10), "abc");
        assert_eq!(cut_within("ééé".to_owned(), 5), "éé");
    }
}
