//! The parser for number lists: CSV-ish files and `--numbers 2,4,5,11`.
//!
//! Numbers are optionally signed ASCII decimal integers that fit `i64`, separated by `,`, `;` or
//! any whitespace in any mix; empty fields (`1,,2`, a trailing comma) are skipped. Blank lines and
//! lines whose first non-blank character is `#` are skipped anywhere; lines before the first
//! number whose tokens all start with a letter (`value`) are headers and skipped. A header that
//! names several columns (`id,value`) is refused unless one column is chosen ([`parse_column`]):
//! counting every field would mix ids with values. Anything else is an error that says where it
//! is, so a user can fix the file.

/// Most numbers one list may hold. The frame limit usually binds first: a 1 MiB frame holds at
/// most about 500,000 numbers as a JSON array.
pub const NUMBERS_MAX: usize = crate::limits::TASK_NUMBERS_MAX;

/// Longest token, in characters, quoted back in an error.
const TOKEN_ECHO_CHARS_MAX: usize = 40;

/// Why a number list was rejected. Lines and columns are 1-based; columns count characters.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum NumbersError {
    /// A token is not an optionally signed decimal integer.
    #[error("line {line}, column {column}: {token:?} is not an integer")]
    BadToken {
        /// Line of the token.
        line: usize,
        /// Column of its first character.
        column: usize,
        /// The token (shortened to 40 characters and `...` if longer).
        token: String,
    },
    /// A token is an integer outside `i64`.
    #[error(
        "line {line}, column {column}: {token:?} is outside the 64-bit integer range {}..={}",
        i64::MIN,
        i64::MAX
    )]
    OutOfRange {
        /// Line of the token.
        line: usize,
        /// Column of its first character.
        column: usize,
        /// The token (shortened to 40 characters and `...` if longer).
        token: String,
    },
    /// The list has more than [`NUMBERS_MAX`] numbers.
    #[error("the list has more than {max} numbers")]
    TooMany {
        /// The most numbers allowed.
        max: usize,
    },
    /// The header names several columns and no column was chosen: counting them all would
    /// mix, say, ids with values.
    #[error("the header names {} columns ({}); choose one with --column NAME or --column N", columns.len(), columns.join(", "))]
    SeveralColumns {
        /// The header's column names.
        columns: Vec<String>,
    },
    /// The chosen column is not in the header (or there is no header to find a name in).
    #[error("there is no column {column:?} (the header names: {})", if header.is_empty() { "none, there is no header line".to_string() } else { header.join(", ") })]
    NoSuchColumn {
        /// The column asked for.
        column: String,
        /// The header's column names (empty without a header).
        header: Vec<String>,
    },
    /// A data line has fewer fields than the chosen column's position.
    #[error("line {line} has no column {column} (it has {fields} fields)")]
    MissingField {
        /// Line of the row.
        line: usize,
        /// The chosen column, 1-based.
        column: usize,
        /// Fields the row has.
        fields: usize,
    },
}

/// Which column of a table holds the numbers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Column {
    /// The column the header names so.
    Named(String),
    /// The n-th field of every row, 1-based.
    Position(usize),
}

impl std::str::FromStr for Column {
    type Err = String;

    /// A positive number is a position; anything else is a name.
    fn from_str(raw: &str) -> Result<Column, String> {
        let raw = raw.trim();
        match raw.parse::<usize>() {
            Ok(0) => Err("columns are numbered from 1".to_string()),
            Ok(n) => Ok(Column::Position(n)),
            Err(_) if raw.is_empty() => Err("a column needs a name or a number".to_string()),
            Err(_) => Ok(Column::Named(raw.to_string())),
        }
    }
}

/// Parses a number list; see the module documentation for the format. A header naming several
/// columns is refused: use [`parse_column`] to pick one.
pub fn parse_numbers(text: &str) -> Result<Vec<i64>, NumbersError> {
    // Spreadsheet exports often start with a byte-order mark; it is not part of a token.
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    if let Some((_, header)) = header_line(text) {
        if header.len() > 1 {
            return Err(NumbersError::SeveralColumns {
                columns: header.into_iter().map(echo).collect(),
            });
        }
    }
    let mut numbers = Vec::new();
    let mut in_data = false;
    // '\r' of a CRLF ending is whitespace, so splitting on '\n' handles both endings.
    for (index, line) in text.split('\n').enumerate() {
        if line.trim_start().starts_with('#') {
            continue;
        }
        if !in_data {
            let mut tokens = Tokens::new(line).peekable();
            // A line of separators only is as blank as an empty one.
            if tokens.peek().is_none() {
                continue;
            }
            if tokens.all(|(_, token)| token.starts_with(char::is_alphabetic)) {
                continue;
            }
            in_data = true;
        }
        for (column, token) in Tokens::new(line) {
            push_bounded(&mut numbers, parse_at(token, index + 1, column)?)?;
        }
    }
    Ok(numbers)
}

/// The numbers of one column of a table: rows split on the header's delimiter (the first of
/// `,` `;` and tab it holds, else runs of whitespace), or the first data row's without a header.
/// Blank and `#` lines are skipped as in [`parse_numbers`]; every other row must have the
/// column, and its field must be a number.
pub fn parse_column(text: &str, column: &Column) -> Result<Vec<i64>, NumbersError> {
    let text = text.strip_prefix('\u{feff}').unwrap_or(text);
    let header = header_line(text);
    let position = match (column, &header) {
        (Column::Position(n), _) => *n,
        (Column::Named(name), Some((_, names))) => {
            match names.iter().position(|n| n.eq_ignore_ascii_case(name)) {
                Some(i) => i + 1,
                None => {
                    return Err(NumbersError::NoSuchColumn {
                        column: echo(name),
                        header: names.iter().map(|n| echo(n)).collect(),
                    })
                }
            }
        }
        (Column::Named(name), None) => {
            return Err(NumbersError::NoSuchColumn {
                column: echo(name),
                header: Vec::new(),
            })
        }
    };
    let header_index = header.as_ref().map(|(index, _)| *index);
    let mut delimiter = header_index
        .and_then(|i| text.split('\n').nth(i))
        .map(delimiter_of);
    let mut numbers = Vec::new();
    for (index, line) in text.split('\n').enumerate() {
        let trimmed = line.trim();
        if trimmed.is_empty() || trimmed.starts_with('#') || Some(index) == header_index {
            continue;
        }
        let delimiter = *delimiter.get_or_insert_with(|| delimiter_of(line));
        let fields: Vec<&str> = match delimiter {
            Some(d) => line.split(d).map(str::trim).collect(),
            None => line.split_whitespace().collect(),
        };
        let Some(field) = fields.get(position - 1) else {
            return Err(NumbersError::MissingField {
                line: index + 1,
                column: position,
                fields: fields.len(),
            });
        };
        push_bounded(&mut numbers, parse_at(field, index + 1, position)?)?;
    }
    Ok(numbers)
}

/// `token`, found at `line` and `column`, as a number, or the error that says where it is.
fn parse_at(token: &str, line: usize, column: usize) -> Result<i64, NumbersError> {
    parse_token(token).map_err(|bad| {
        let token = echo(token);
        match bad {
            BadNumber::NotAnInteger => NumbersError::BadToken {
                line,
                column,
                token,
            },
            BadNumber::OutOfRange => NumbersError::OutOfRange {
                line,
                column,
                token,
            },
        }
    })
}

/// Adds `number`, unless the list already holds [`NUMBERS_MAX`].
fn push_bounded(numbers: &mut Vec<i64>, number: i64) -> Result<(), NumbersError> {
    if numbers.len() == NUMBERS_MAX {
        return Err(NumbersError::TooMany { max: NUMBERS_MAX });
    }
    numbers.push(number);
    Ok(())
}

/// The first line that is neither blank nor a comment, if every token of it starts with a
/// letter: its index and its tokens.
fn header_line(text: &str) -> Option<(usize, Vec<&str>)> {
    let (index, line) = text.split('\n').enumerate().find(|(_, line)| {
        let line = line.trim_start();
        !line.starts_with('#') && Tokens::new(line).next().is_some()
    })?;
    let tokens: Vec<&str> = Tokens::new(line).map(|(_, token)| token).collect();
    tokens
        .iter()
        .all(|token| token.starts_with(char::is_alphabetic))
        .then_some((index, tokens))
}

/// The field delimiter of a row: the first of `,` `;` and tab it holds (`None`: whitespace).
fn delimiter_of(line: &str) -> Option<char> {
    [',', ';', '\t'].into_iter().find(|d| line.contains(*d))
}

enum BadNumber {
    NotAnInteger,
    OutOfRange,
}

/// An optional sign and ASCII digits, as `i64`. Checking the shape first leaves overflow as
/// the only way `parse` can fail.
fn parse_token(token: &str) -> Result<i64, BadNumber> {
    let digits = token.strip_prefix(['+', '-']).unwrap_or(token);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return Err(BadNumber::NotAnInteger);
    }
    token.parse().map_err(|_| BadNumber::OutOfRange)
}

fn is_separator(c: char) -> bool {
    c == ',' || c == ';' || c.is_whitespace()
}

/// A token to quote in an error, cut at a character boundary if it is long.
fn echo(token: &str) -> String {
    match token.char_indices().nth(TOKEN_ECHO_CHARS_MAX) {
        Some((cut, _)) => format!("{}...", &token[..cut]),
        None => token.to_string(),
    }
}

/// The tokens of one line with their 1-based character columns.
struct Tokens<'a> {
    line: &'a str,
    chars: std::iter::Peekable<std::str::CharIndices<'a>>,
    /// Characters consumed so far.
    consumed: usize,
}

impl<'a> Tokens<'a> {
    fn new(line: &'a str) -> Tokens<'a> {
        Tokens {
            line,
            chars: line.char_indices().peekable(),
            consumed: 0,
        }
    }
}

impl<'a> Iterator for Tokens<'a> {
    type Item = (usize, &'a str);

    fn next(&mut self) -> Option<(usize, &'a str)> {
        while self.chars.next_if(|&(_, c)| is_separator(c)).is_some() {
            self.consumed += 1;
        }
        let &(start, _) = self.chars.peek()?;
        let column = self.consumed + 1;
        let mut end = self.line.len();
        while let Some(&(at, c)) = self.chars.peek() {
            if is_separator(c) {
                end = at;
                break;
            }
            self.chars.next();
            self.consumed += 1;
        }
        // Both ends come from `char_indices` (or the line's end), so they are char boundaries.
        Some((column, &self.line[start..end]))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn parse(text: &str) -> Vec<i64> {
        parse_numbers(text).unwrap()
    }

    fn bad(line: usize, column: usize, token: &str) -> Result<Vec<i64>, NumbersError> {
        Err(NumbersError::BadToken {
            line,
            column,
            token: token.into(),
        })
    }

    #[test]
    fn separators_in_any_mix() {
        let expected = vec![2, 4, 5, 11];
        for text in [
            "2,4,5,11",
            "2;4;5;11",
            "2 4\t5\n11",
            "2, 4 ;5\r\n11\r\n",
            "2,,4;;5 ,; 11,",
            ",2\n\n\n4\n5;\t\n11\n\n",
            "2\u{a0}4\u{3000}5\r11", // any Unicode whitespace, a lone '\r' too
        ] {
            assert_eq!(parse(text), expected, "{text:?}");
        }
    }

    #[test]
    fn signs_and_extremes() {
        assert_eq!(parse("-5,+5,-0,+0,007"), [-5, 5, 0, 0, 7]);
        assert_eq!(
            parse("-9223372036854775808 9223372036854775807"),
            [i64::MIN, i64::MAX]
        );
        for (text, token) in [
            ("9223372036854775808", "9223372036854775808"),
            ("1,-9223372036854775809", "-9223372036854775809"),
        ] {
            let column = text.len() - token.len() + 1;
            assert_eq!(
                parse_numbers(text),
                Err(NumbersError::OutOfRange {
                    line: 1,
                    column,
                    token: token.into()
                })
            );
        }
    }

    #[test]
    fn headers_and_comments() {
        assert_eq!(parse("value\n1\n2\n"), [1, 2]);
        // Several columns under a header: which one is meant must be said.
        assert!(matches!(
            parse_numbers("id;label\r\n1;2\r\n"),
            Err(NumbersError::SeveralColumns { .. })
        ));
        assert_eq!(parse("\u{feff}value\n1"), [1]);
        assert_eq!(
            parse("# numbers\n\nvalue\n  # units: none\nGröße, x_1\n1\n # 5, 6\n2"),
            [1, 2]
        );
        // A header may not come after data, nor mix with numbers.
        assert_eq!(parse_numbers("1\nvalue"), bad(2, 1, "value"));
        assert_eq!(parse_numbers("value, 5"), bad(1, 1, "value"));
        // A comment is a whole line, not the rest of one.
        assert_eq!(parse_numbers("1 # one"), bad(1, 3, "#"));
    }

    #[test]
    fn empty_lists() {
        for text in ["", "\n\n", " ,; \r\n", "value\n", "# nothing\n", "\u{feff}"] {
            assert_eq!(parse(text), Vec::<i64>::new(), "{text:?}");
        }
    }

    #[test]
    fn bad_tokens() {
        for token in [
            "1.5", "1e3", "0x10", "12abc", "-", "+", "--1", "+-1", "１", "1_000", "½",
        ] {
            assert_eq!(parse_numbers(&format!("7,{token}")), bad(1, 3, token));
        }
        assert_eq!(parse_numbers("1, 2\n3, 1.5"), bad(2, 4, "1.5"));
        // Columns count characters, not bytes.
        let error = parse_numbers("1;\u{a0}2;\u{3000}1.5").unwrap_err();
        assert_eq!(error, bad(1, 7, "1.5").unwrap_err());
        assert_eq!(
            error.to_string(),
            "line 1, column 7: \"1.5\" is not an integer"
        );
        assert_eq!(parse_numbers("value\n€5"), bad(2, 1, "€5"));
        assert_eq!(parse_numbers("größe\n1 ü 2"), bad(2, 3, "ü"));
    }

    #[test]
    fn messages() {
        let error = parse_numbers("1\n\n  99999999999999999999").unwrap_err();
        assert_eq!(
            error.to_string(),
            "line 3, column 3: \"99999999999999999999\" is outside the 64-bit integer range \
             -9223372036854775808..=9223372036854775807"
        );
        assert_eq!(
            NumbersError::TooMany { max: NUMBERS_MAX }.to_string(),
            "the list has more than 1000000 numbers"
        );
        // Control characters are escaped, long tokens cut.
        let error = parse_numbers(&format!("1 é\u{7}{}", "x".repeat(100))).unwrap_err();
        let token = format!("é\u{7}{}...", "x".repeat(38));
        assert_eq!(error, bad(1, 3, &token).unwrap_err());
        assert!(error.to_string().contains("\"é\\u{7}xxx"));
    }

    #[test]
    fn a_header_of_several_columns_needs_a_column_chosen() {
        let table = "id,value\n1,10\n2,-20\n\n# a comment\n3,30\n";
        assert_eq!(
            parse_numbers(table),
            Err(NumbersError::SeveralColumns {
                columns: vec!["id".into(), "value".into()]
            })
        );
        let named = Column::Named("Value".into());
        assert_eq!(parse_column(table, &named), Ok(vec![10, -20, 30]));
        assert_eq!(parse_column(table, &Column::Position(1)), Ok(vec![1, 2, 3]));
        assert_eq!(
            parse_column(table, &Column::Named("price".into())),
            Err(NumbersError::NoSuchColumn {
                column: "price".into(),
                header: vec!["id".into(), "value".into()]
            })
        );
        assert_eq!(
            parse_column(table, &Column::Position(3)),
            Err(NumbersError::MissingField {
                line: 2,
                column: 3,
                fields: 2
            })
        );
        // Semicolons, tabs and whitespace delimit too; empty fields keep their place.
        assert_eq!(
            parse_column("a;b;c\n1;;3\n4;5;6\n", &Column::Position(3)),
            Ok(vec![3, 6])
        );
        assert_eq!(
            parse_column("1\t2\n3\t4\n", &Column::Position(2)),
            Ok(vec![2, 4])
        );
        assert_eq!(
            parse_column("1 2\n3 4\n", &Column::Position(1)),
            Ok(vec![1, 3])
        );
        assert!(matches!(
            parse_column("a,b\n1,x\n", &Column::Position(2)),
            Err(NumbersError::BadToken {
                line: 2,
                column: 2,
                ..
            })
        ));
        // A name needs a header to be found in.
        assert!(matches!(
            parse_column("1,2\n", &Column::Named("value".into())),
            Err(NumbersError::NoSuchColumn { header, .. }) if header.is_empty()
        ));
        // One column under a header is a plain list, as before.
        assert_eq!(parse_numbers("value\n1\n2\n"), Ok(vec![1, 2]));
        assert_eq!("2".parse::<Column>(), Ok(Column::Position(2)));
        assert_eq!("value".parse::<Column>(), Ok(Column::Named("value".into())));
        assert!("0".parse::<Column>().is_err());
    }

    #[test]
    fn too_many() {
        let most = "0,".repeat(NUMBERS_MAX);
        assert_eq!(parse_numbers(&most).map(|n| n.len()), Ok(NUMBERS_MAX));
        assert_eq!(
            parse_numbers(&format!("{most}0")),
            Err(NumbersError::TooMany { max: NUMBERS_MAX })
        );
    }

    proptest! {
        #[test]
        fn formatted_lists_parse_back(
            numbers in prop::collection::vec(any::<i64>(), 0..40),
            separators in prop::collection::vec(
                prop::sample::select(vec![",", ";", " ", "\t", "\n", "\r\n", ", ", " ; ", ",,", "\n\n"]),
                40,
            ),
            header in prop::sample::select(vec!["", "value\n", "Label\r\n", "# data\n"]),
        ) {
            let mut text = header.to_string();
            for (number, separator) in numbers.iter().zip(&separators) {
                text.push_str(&number.to_string());
                text.push_str(separator);
            }
            prop_assert_eq!(parse_numbers(&text), Ok(numbers));
        }

        #[test]
        fn any_text_parses_or_fails_cleanly(text in "[0-9+\\-,; \t\r\n#a-zé.\u{3000}]{0,40}") {
            match parse_numbers(&text) {
                Ok(numbers) => prop_assert!(numbers.len() <= text.len()),
                Err(NumbersError::BadToken { line, column, token })
                | Err(NumbersError::OutOfRange { line, column, token }) => {
                    let lines: Vec<&str> = text.split('\n').collect();
                    prop_assert!(line >= 1 && line <= lines.len());
                    let found: String = lines[line - 1].chars().skip(column - 1).take(token.chars().count()).collect();
                    prop_assert_eq!(found, token);
                }
                Err(NumbersError::TooMany { .. }) => prop_assert!(false, "too many"),
                Err(NumbersError::SeveralColumns { columns }) => prop_assert!(columns.len() > 1),
                Err(other) => prop_assert!(false, "{other} without a column chosen"),
            }
        }

        #[test]
        fn arbitrary_text_never_panics(text in any::<String>()) {
            let _ = parse_numbers(&text);
        }
    }
}
