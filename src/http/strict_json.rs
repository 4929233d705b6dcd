//! The request body's JSON rules that typed parsing cannot see: the top
//! level is an object, and no object anywhere repeats a key. With a repeated
//! key, parsers disagree on which value counts (ours took the last, a log or
//! a proxy may read the first), so a body could say one thing to a reviewer
//! and another to the model; it is refused instead.
//!
//! One pass over the bytes, allocating only the keys of the objects being
//! read. Syntax errors are left to the typed parse, whose messages say where.

use std::cell::RefCell;
use std::collections::HashSet;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

/// `Some(message)` when `body` breaks a rule, naming where; `None` when it
/// keeps them or is not valid JSON at all.
pub fn check(body: &[u8]) -> Option<String> {
    let walk = Walk {
        path: RefCell::new(Vec::new()),
        problem: RefCell::new(None),
    };
    let mut deserializer = serde_json::Deserializer::from_slice(body);
    let _ = Node {
        walk: &walk,
        top: true,
    }
    .deserialize(&mut deserializer);
    walk.problem.into_inner()
}

enum Segment {
    Index(usize),
    Key(String),
}

struct Walk {
    /// Where the walk is, for the message.
    path: RefCell<Vec<Segment>>,
    problem: RefCell<Option<String>>,
}

impl Walk {
    /// `input[0].text`, as the typed parse writes paths.
    fn path_to(&self, key: &str) -> String {
        let mut out = String::new();
        for segment in self.path.borrow().iter() {
            match segment {
                Segment::Index(i) => out.push_str(&format!("[{i}]")),
                Segment::Key(k) => {
                    if !out.is_empty() {
                        out.push('.');
                    }
                    out.push_str(k);
                }
            }
        }
        if !out.is_empty() {
            out.push('.');
        }
        out.push_str(key);
        out
    }

    /// Records the problem and stops the walk.
    fn fail<E: de::Error>(&self, message: String) -> E {
        *self.problem.borrow_mut() = Some(message);
        E::custom("refused")
    }
}

struct Node<'w> {
    walk: &'w Walk,
    top: bool,
}

impl<'de> DeserializeSeed<'de> for Node<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<(), D::Error> {
        deserializer.deserialize_any(self)
    }
}

impl Node<'_> {
    fn scalar<E: de::Error>(&self) -> Result<(), E> {
        if self.top {
            return Err(self
                .walk
                .fail("the request body must be a JSON object".into()));
        }
        Ok(())
    }
}

impl<'de> Visitor<'de> for Node<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_bool<E: de::Error>(self, _: bool) -> Result<(), E> {
        self.scalar()
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<(), E> {
        self.scalar()
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<(), E> {
        self.scalar()
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<(), E> {
        self.scalar()
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<(), E> {
        self.scalar()
    }
    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.scalar()
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.scalar()?;
        let mut index = 0;
        loop {
            self.walk.path.borrow_mut().push(Segment::Index(index));
            let element = seq.next_element_seed(Node {
                walk: self.walk,
                top: false,
            });
            self.walk.path.borrow_mut().pop();
            if element?.is_none() {
                return Ok(());
            }
            index += 1;
        }
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut seen = HashSet::new();
        while let Some(key) = map.next_key::<String>()? {
            if seen.contains(&key) {
                let message = format!(
                    "{}: duplicate key; each key may appear only once in an object",
                    self.walk.path_to(&key)
                );
                return Err(self.walk.fail(message));
            }
            self.walk.path.borrow_mut().push(Segment::Key(key.clone()));
            let value = map.next_value_seed(Node {
                walk: self.walk,
                top: false,
            });
            self.walk.path.borrow_mut().pop();
            value?;
            seen.insert(key);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::check;

    #[test]
    fn duplicate_keys_are_named_with_their_path() {
        let body = br#"{"input":[{"type":"text","text":"I will kill you","text":"hello"}]}"#;
        let message = check(body).expect("refused");
        assert!(
            message.starts_with("input[0].text: duplicate key"),
            "{message}"
        );
        let message = check(br#"{"input":[],"input":[]}"#).expect("refused");
        assert!(message.starts_with("input: duplicate key"), "{message}");
        let deep = br#"{"a":{"b":[1,{"c":1,"c":2}]}}"#;
        assert!(check(deep).expect("refused").starts_with("a.b[1].c:"));
    }

    #[test]
    fn the_top_level_must_be_an_object() {
        for body in [&b"[1,2]"[..], b"\"text\"", b"3", b"null", b" true "] {
            assert_eq!(
                check(body).as_deref(),
                Some("the request body must be a JSON object")
            );
        }
    }

    #[test]
    fn valid_bodies_and_syntax_errors_pass() {
        assert_eq!(check(br#"{"a":{"a":1},"b":[{"a":1},{"a":2}]}"#), None);
        assert_eq!(check(b"{nope"), None);
        assert_eq!(check(b""), None);
        // Keys equal only after unescaping are the same key.
        assert!(check(br#"{"text":1,"te\u0078t":2}"#).is_some());
    }
}
