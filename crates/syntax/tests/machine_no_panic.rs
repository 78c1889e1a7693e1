//! No text makes the parser or the formatter panic inside a `machine`,
//! where the lexer reads durations, IPv4 addresses, `;` and `%`, nor
//! formatting what it parsed, nor parsing that again.

use flick_syntax::{format_program, parse};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn machine_text_never_panics(
        body in "([ \n]|  |stage|key|on|in|when|from|next|drop|set|goto|flow|states|meta|:=|[a-z.:;%,()=<>+*/-]|[0-9]{1,25}(s|ms|us)?|1\\.2\\.3\\.4|#x\n){0,60}"
    ) {
        let text = format!("machine m: (packet/packet a)\n  stage s:\n{body}");
        let (p, _) = parse(&text);
        let formatted = format_program(&p);
        let _ = parse(&formatted);
    }
}
