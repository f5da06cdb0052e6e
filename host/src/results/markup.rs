//! Text made safe inside XML and HTML: the JUnit file and the HTML report share it.

/// `text` made safe as XML or HTML text and attribute values: the five markup characters
/// escaped, and control characters (which XML 1.0 forbids) dropped but for newline and tab.
pub fn escape(text: &str) -> String {
    text.chars()
        .filter(|c| !c.is_control() || matches!(c, '\n' | '\t'))
        .map(|c| match c {
            '&' => "&amp;".to_string(),
            '<' => "&lt;".to_string(),
            '>' => "&gt;".to_string(),
            '"' => "&quot;".to_string(),
            '\'' => "&apos;".to_string(),
            c => c.to_string(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markup_characters_are_escaped_and_control_characters_dropped() {
        assert_eq!(
            escape("<a href=\"x\">Tom & 'Jerry'</a>"),
            "&lt;a href=&quot;x&quot;&gt;Tom &amp; &apos;Jerry&apos;&lt;/a&gt;"
        );
        assert_eq!(escape("a\u{1b}[31mb\u{0}c\nd\te"), "a[31mbc\nd\te");
    }
}
