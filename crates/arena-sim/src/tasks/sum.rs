//! The `sum` family: "What is 7 + 5?", two numbers from 1 to 9 drawn from the row's digits, no tool.
//!
//! Sized for a small pretrained instruct model (SmolLM2-135M-Instruct) that solves part of it untrained, so
//! GRPO has signal from the first step. The grade gives partial credit twice over:
//!
//! - closeness: `c = max(0, 1 - |answer - target| / 3)` for the last integer in the reply, 0 without one;
//! - form: the full `c` when the reply is the number alone (whitespace and one trailing period allowed),
//!   [`IN_TEXT_CREDIT`] (3/4) of it when the number comes inside other text ("The answer is 85.").
//!
//! So an exact bare answer scores 1, an exact answer inside a sentence ("7 + 5 = 12.", the untrained
//! model's habit) 0.75, and an answer off by one 2/3 (bare) or 1/2. The span is narrow so that no constant
//! pays: always answering the likeliest sum, 10, scores about 0.30.
//!
//! The scale was fixed against the untrained model before any RL setting was tuned. Sampled at temperature
//! 0.7 with at most 16 new tokens, SmolLM2-135M-Instruct ends its reply with the right sum about 31% of the
//! time, almost always inside a sentence (5% of replies are a bare number), and rambles off the question
//! in about half. Half credit in text put its mean at 0.18, under the 0.2 to 0.6 a task needs to give GRPO
//! signal both ways; three quarters puts it at about 0.27, and leaves a quarter of each right answer to be
//! earned by answering with the number alone.

use super::Grade;

/// Answers this far or further from the target score 0.
pub const CLOSENESS_SPAN: f64 = 3.0;

/// The share of the closeness credit an answer earns when the number comes inside other text.
pub const IN_TEXT_CREDIT: f64 = 0.75;

/// The two operands of the task whose digits are `digits`: the first two nonzero digits, each 1 to 9 (a
/// zero becomes 9), so every sum is 2 to 18.
pub fn operands(digits: &[u8]) -> (u32, u32) {
    let one = |d: u8| if d == 0 { 9 } else { u32::from(d) };
    (one(digits[0]), one(digits[1]))
}

/// The prompt of the task `a + b`.
pub fn prompt((a, b): (u32, u32)) -> String {
    format!("What is {a} + {b}? Answer with the number only.")
}

/// Grades a reply against `target` (see the module docs). `lookup_ok` is always true: nothing is to be looked
/// up.
pub fn grade(target: u32, final_answer: Option<&str>) -> Grade {
    let text = final_answer.unwrap_or("").trim();
    let answer = last_integer(text);
    let score = match answer {
        Some(a) => {
            let closeness = (1.0 - f64::from(a.abs_diff(target)) / CLOSENESS_SPAN).max(0.0);
            let bare = text.trim_end_matches('.').trim().parse::<u32>().ok() == Some(a);
            if bare {
                closeness
            } else {
                closeness * IN_TEXT_CREDIT
            }
        }
        None => 0.0,
    };
    Grade {
        score,
        lookup_ok: true,
        answer,
        target,
    }
}

/// The last run of ASCII digits in `text`, when it fits in a `u32`.
fn last_integer(text: &str) -> Option<u32> {
    let end = text.rfind(|c: char| c.is_ascii_digit())? + 1;
    // After the last non-digit character, which may be several bytes long (a model's reply is any text).
    let start = text[..end]
        .char_indices()
        .rev()
        .find(|(_, c)| !c.is_ascii_digit())
        .map_or(0, |(i, c)| i + c.len_utf8());
    text[start..end].parse().ok()
}
