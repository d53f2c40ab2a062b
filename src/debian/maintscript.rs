//! What a package's maintainer script does on a fresh install (`preinst install`,
//! `postinst configure` with no old version), read as /bin/sh would run it but without
//! running anything: the script is parsed and evaluated against a view of the image
//! ([`World`]), and the commands whose effect on files gpubake makes itself come out as
//! [`Effect`]s (update-alternatives, addgroup, dpkg-statoverride, chmod, chgrp, chown).
//! Queries are answered from the image (`getent`, `dpkg --compare-versions`,
//! `dpkg-statoverride --list`, file tests), and commands that change nothing in an image
//! that is not running count as done (`ldconfig`, whose cache is settled for the whole
//! image; `udevadm trigger`; `invoke-rc.d`). The first command of any other kind stops the
//! evaluation and is named, so the caller can refuse the package rather than leave an image
//! half-configured.
//!
//! The shell read is the part of POSIX sh that Debian's scripts use: simple commands with
//! assignments and redirections, `&&`, `||`, `!`, pipelines, `if`, `case`, `for`, `{ }`,
//! functions, `set -e`, `exit` and `return`, quoting, `$1`-style and `${VAR:-word}`
//! parameters. A command substitution, a here-document, a loop over files or a write
//! through a redirection stops it the same way as an unknown command.

use std::collections::BTreeMap;

/// What a path is in the image, for `[ -e ]` and its kin.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// A regular file.
    File {
        /// Some execute bit is set.
        executable: bool,
        /// It has no bytes.
        empty: bool,
    },
    /// A directory.
    Dir,
    /// A symbolic link (only when links are not followed).
    Symlink,
}

/// The image as the script sees it.
pub trait World {
    /// What is at `path` (absolute), following links except for `symlink`.
    fn kind(&self, path: &str, follow: bool) -> Option<Kind>;
    /// Whether the group (`group`) or user (`passwd`) exists.
    fn getent(&self, database: &str, name: &str) -> bool;
    /// Whether dpkg has a stat override for `path`.
    fn statoverride(&self, path: &str) -> bool;
}

/// A change to the image that a script makes through a command gpubake models.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// `update-alternatives --install LINK NAME PATH PRIORITY [--slave LINK NAME PATH]...`.
    Alternative {
        /// The link the alternative provides (`/usr/bin/mpirun`).
        link: String,
        /// Its name (`mpirun`).
        name: String,
        /// This choice's file.
        path: String,
        /// This choice's priority.
        priority: i64,
        /// Links that follow the choice.
        slaves: Vec<Slave>,
    },
    /// `update-alternatives --remove NAME PATH`.
    RemoveAlternative {
        /// The alternative.
        name: String,
        /// The choice removed.
        path: String,
    },
    /// `addgroup --system NAME`.
    SystemGroup {
        /// The group.
        name: String,
    },
    /// `dpkg-statoverride --add [--update] USER GROUP MODE PATH`.
    StatOverride {
        /// The owner.
        user: String,
        /// The group.
        group: String,
        /// The permission bits.
        mode: u32,
        /// The file.
        path: String,
        /// Whether the file is changed now (`--update`), not only recorded.
        update: bool,
    },
    /// `update-rc.d NAME defaults` without insserv: the init script's runlevel links, as its
    /// LSB header's Default-Start and Default-Stop give them.
    InitLinks {
        /// The script under /etc/init.d.
        name: String,
    },
    /// `adduser --system NAME` with its options: a system user.
    SystemUser {
        /// The user.
        name: String,
        /// `--uid`, else the first free id of the system range.
        uid: Option<u32>,
        /// The primary group: its own (`--group`), a named one (`--ingroup`), else none
        /// (nogroup).
        group: UserGroup,
        /// `--home`, else /nonexistent.
        home: String,
        /// `--shell`, else /usr/sbin/nologin.
        shell: String,
        /// `--gecos`/`--comment`, else empty.
        gecos: String,
    },
    /// `adduser USER GROUP`: a user joins a group.
    Member {
        /// The user.
        user: String,
        /// The group.
        group: String,
    },
    /// `systemd-sysusers CONF...`: the users and groups those sysusers.d files declare.
    SysUsers {
        /// The files' names (`basic.conf`), looked up as systemd-sysusers does.
        confs: Vec<String>,
    },
    /// `mkdir -p PATH` of a directory the image lacks (made 0755 root:root, as under the
    /// scripts' umask 022).
    MakeDir {
        /// The directory.
        path: String,
    },
    /// `chmod MODE PATH`, with the mode as written (octal or symbolic).
    Chmod {
        /// The mode as the script gives it.
        mode: String,
        /// The file.
        path: String,
    },
    /// `chown`/`chgrp`: the new owner and group, where given.
    Chown {
        /// The new owner, where given.
        user: Option<String>,
        /// The new group, where given.
        group: Option<String>,
        /// The file.
        path: String,
    },
}

/// A system user's primary group.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UserGroup {
    /// A group of the user's name, with the user's id where free (`--group`).
    Own,
    /// An existing group (`--ingroup`).
    Named(String),
    /// nogroup, adduser's choice for a system user without either.
    None,
}

/// One `--slave` of an alternative.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Slave {
    /// The link (`/usr/bin/mpiexec`).
    pub link: String,
    /// Its name (`mpiexec`).
    pub name: String,
    /// The file it leads to with this choice.
    pub path: String,
}

/// What evaluating a script came to.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Outcome {
    /// The modelled changes, in the order the script makes them.
    pub effects: Vec<Effect>,
    /// The first thing the script does that is not modelled, as written (None: all is).
    pub unmodelled: Option<String>,
    /// The script's exit status, when it ran to an end.
    pub status: i32,
    /// What a lenient evaluation passed over, as [`Outcome::unmodelled`] words it.
    pub skipped: Vec<String>,
}

/// Evaluates `script` run as `args` (`["configure"]`, `["install"]`) for `package`. A
/// `lenient` evaluation goes on past what is not modelled, taking each such command as one
/// that succeeds and changes nothing (and a command substitution as printing nothing), and
/// lists what it passed over in [`Outcome::skipped`].
pub fn evaluate(
    script: &str,
    args: &[&str],
    package: &str,
    world: &dyn World,
    lenient: bool,
) -> Outcome {
    let program = match Parser::new(script).program() {
        Ok(p) => p,
        Err(why) => {
            return Outcome {
                unmodelled: Some(format!("uses shell syntax gpubake does not read: {why}")),
                ..Outcome::default()
            };
        }
    };
    let mut vars = BTreeMap::new();
    vars.insert("DPKG_MAINTSCRIPT_PACKAGE".to_string(), package.to_string());
    let mut shell = Shell {
        world,
        vars,
        args: args.iter().map(|s| s.to_string()).collect(),
        functions: BTreeMap::new(),
        errexit: false,
        status: 0,
        effects: Vec::new(),
        depth: 0,
        lenient,
        skipped: Vec::new(),
    };
    let flow = shell.list(&program, false);
    let (unmodelled, status) = match flow {
        Flow::Stop(what) => (Some(what), shell.status),
        Flow::Exit(s) | Flow::Return(s) | Flow::Next(s) => (None, s),
    };
    Outcome {
        effects: shell.effects,
        unmodelled,
        status,
        skipped: shell.skipped,
    }
}

// ---- syntax ----------------------------------------------------------------------------

#[derive(Clone, Debug, PartialEq)]
enum Part {
    /// Literal text; `quoted` text is neither split nor a keyword.
    Lit(String, bool),
    /// `$NAME`, `${NAME}`, `${NAME:-word}` (op and word), quoted or not.
    Param(String, Option<(String, Word)>, bool),
    /// `$(...)` or backquotes: never evaluated.
    Subst(String),
}

type Word = Vec<Part>;

#[derive(Clone, Debug, PartialEq)]
enum Token {
    Word(Word),
    Op(&'static str),
    Newline,
    /// A redirection (`>`, `2>&1`, `<`) with its target; `<<` stops the evaluation.
    Redirect(String, Word),
}

#[derive(Debug, Clone)]
enum Command {
    Simple {
        assigns: Vec<(String, Word)>,
        words: Vec<Word>,
        redirects: Vec<(String, Word)>,
    },
    If {
        arms: Vec<(List, List)>,
        otherwise: Option<List>,
    },
    Case {
        word: Word,
        arms: Vec<(Vec<Word>, List)>,
    },
    For {
        var: String,
        words: Vec<Word>,
        body: List,
    },
    Group(List),
    Function(String, Box<Command>),
    /// A construct read but not modelled (`while`, a subshell): its text's first word.
    Unread(String),
}

#[derive(Debug, Clone)]
struct Pipeline {
    bang: bool,
    commands: Vec<Command>,
}

/// Pipelines joined by `&&` (true) and `||` (false).
type AndOr = (Pipeline, Vec<(bool, Pipeline)>);
type List = Vec<AndOr>;

struct Lexer<'a> {
    text: &'a [u8],
    at: usize,
}

impl Lexer<'_> {
    fn peek(&self) -> Option<u8> {
        self.text.get(self.at).copied()
    }

    fn tokens(mut self) -> Result<Vec<Token>, String> {
        let mut out = Vec::new();
        loop {
            // Blanks and line continuations between tokens.
            while let Some(c) = self.peek() {
                if c == b' ' || c == b'\t' {
                    self.at += 1;
                } else if c == b'\\' && self.text.get(self.at + 1) == Some(&b'\n') {
                    self.at += 2;
                } else {
                    break;
                }
            }
            let Some(c) = self.peek() else {
                return Ok(out);
            };
            match c {
                b'#' => {
                    while self.peek().is_some_and(|c| c != b'\n') {
                        self.at += 1;
                    }
                }
                b'\n' => {
                    self.at += 1;
                    out.push(Token::Newline);
                }
                b';' | b'&' | b'|' | b'(' | b')' => {
                    let two = self.text.get(self.at..self.at + 2).unwrap_or_default();
                    let op = match two {
                        b";;" => ";;",
                        b"&&" => "&&",
                        b"||" => "||",
                        _ => match c {
                            b';' => ";",
                            b'&' => "&",
                            b'|' => "|",
                            b'(' => "(",
                            _ => ")",
                        },
                    };
                    self.at += op.len();
                    out.push(Token::Op(op));
                }
                b'<' | b'>' => out.push(self.redirect(String::new())?),
                _ => {
                    let word = self.word()?;
                    // `2>&1`: a word of digits right before a redirection is its descriptor.
                    if let [Part::Lit(digits, false)] = word.as_slice()
                        && digits.bytes().all(|b| b.is_ascii_digit())
                        && matches!(self.peek(), Some(b'<' | b'>'))
                    {
                        out.push(self.redirect(digits.clone())?);
                    } else {
                        out.push(Token::Word(word));
                    }
                }
            }
        }
    }

    fn redirect(&mut self, fd: String) -> Result<Token, String> {
        let start = self.at;
        while matches!(self.peek(), Some(b'<' | b'>' | b'&' | b'|')) {
            self.at += 1;
        }
        let op = format!(
            "{fd}{}",
            String::from_utf8_lossy(&self.text[start..self.at])
        );
        if op.ends_with("<<") || op.contains("<<") {
            return Err("a here-document".into());
        }
        while matches!(self.peek(), Some(b' ' | b'\t')) {
            self.at += 1;
        }
        let target = self.word()?;
        Ok(Token::Redirect(op, target))
    }

    /// One word: up to an unquoted blank, newline or operator.
    fn word(&mut self) -> Result<Word, String> {
        let mut parts: Word = Vec::new();
        let mut lit = String::new();
        let flush = |lit: &mut String, parts: &mut Word, quoted: bool| {
            if !lit.is_empty() || quoted {
                parts.push(Part::Lit(std::mem::take(lit), quoted));
            }
        };
        while let Some(c) = self.peek() {
            match c {
                b' ' | b'\t' | b'\n' | b';' | b'&' | b'|' | b'(' | b')' | b'<' | b'>' => break,
                b'\\' => {
                    self.at += 1;
                    match self.peek() {
                        Some(b'\n') => self.at += 1,
                        Some(n) => {
                            flush(&mut lit, &mut parts, false);
                            parts.push(Part::Lit((n as char).to_string(), true));
                            self.at += 1;
                        }
                        None => {}
                    }
                }
                b'\'' => {
                    flush(&mut lit, &mut parts, false);
                    self.at += 1;
                    let start = self.at;
                    while self.peek().is_some_and(|c| c != b'\'') {
                        self.at += 1;
                    }
                    if self.peek().is_none() {
                        return Err("an unterminated '".into());
                    }
                    let text = String::from_utf8_lossy(&self.text[start..self.at]).into_owned();
                    self.at += 1;
                    parts.push(Part::Lit(text, true));
                }
                b'"' => {
                    flush(&mut lit, &mut parts, false);
                    self.at += 1;
                    let mut inner = String::new();
                    let mut any = false;
                    loop {
                        match self.peek() {
                            None => return Err("an unterminated \"".into()),
                            Some(b'"') => {
                                self.at += 1;
                                break;
                            }
                            Some(b'\\') => {
                                let n = self.text.get(self.at + 1).copied();
                                match n {
                                    Some(b'\n') => self.at += 2,
                                    Some(n @ (b'$' | b'`' | b'"' | b'\\')) => {
                                        inner.push(n as char);
                                        self.at += 2;
                                    }
                                    _ => {
                                        inner.push('\\');
                                        self.at += 1;
                                    }
                                }
                            }
                            Some(b'$') | Some(b'`') => {
                                if !inner.is_empty() {
                                    parts.push(Part::Lit(std::mem::take(&mut inner), true));
                                }
                                any = true;
                                parts.push(self.dollar(true)?);
                            }
                            Some(c) => {
                                let ch_len = utf8_len(c);
                                inner.push_str(&String::from_utf8_lossy(
                                    &self.text[self.at..self.at + ch_len],
                                ));
                                self.at += ch_len;
                            }
                        }
                    }
                    if !inner.is_empty() || !any {
                        parts.push(Part::Lit(inner, true));
                    }
                }
                b'$' | b'`' => {
                    flush(&mut lit, &mut parts, false);
                    parts.push(self.dollar(false)?);
                }
                _ => {
                    let ch_len = utf8_len(c);
                    lit.push_str(&String::from_utf8_lossy(
                        &self.text[self.at..(self.at + ch_len).min(self.text.len())],
                    ));
                    self.at += ch_len;
                }
            }
        }
        flush(&mut lit, &mut parts, false);
        Ok(parts)
    }

    /// `$...` or a backquoted command at the cursor.
    fn dollar(&mut self, quoted: bool) -> Result<Part, String> {
        if self.peek() == Some(b'`') {
            self.at += 1;
            let start = self.at;
            while self.peek().is_some_and(|c| c != b'`') {
                self.at += 1;
            }
            let text = String::from_utf8_lossy(&self.text[start..self.at]).into_owned();
            self.at += 1;
            return Ok(Part::Subst(text));
        }
        self.at += 1;
        match self.peek() {
            Some(b'(') => {
                let start = self.at;
                let mut depth = 0;
                while let Some(c) = self.peek() {
                    self.at += 1;
                    if c == b'(' {
                        depth += 1;
                    } else if c == b')' {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                }
                Ok(Part::Subst(
                    String::from_utf8_lossy(&self.text[start..self.at]).into_owned(),
                ))
            }
            Some(b'{') => {
                self.at += 1;
                let start = self.at;
                while self
                    .peek()
                    .is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_')
                {
                    self.at += 1;
                }
                let name = String::from_utf8_lossy(&self.text[start..self.at]).into_owned();
                if self.peek() == Some(b'}') {
                    self.at += 1;
                    return Ok(Part::Param(name, None, quoted));
                }
                let op_start = self.at;
                if let Some(c @ (b'#' | b'%')) = self.peek() {
                    // Prefix (`#`, `##`) and suffix (`%`, `%%`) removal.
                    self.at += 1;
                    if self.peek() == Some(c) {
                        self.at += 1;
                    }
                } else {
                    if self.peek() == Some(b':') {
                        self.at += 1;
                    }
                    if matches!(self.peek(), Some(b'-' | b'=' | b'+' | b'?')) {
                        self.at += 1;
                    }
                }
                let op = String::from_utf8_lossy(&self.text[op_start..self.at]).into_owned();
                const OPS: [&str; 12] = [
                    "-", ":-", "+", ":+", "=", ":=", "?", ":?", "#", "##", "%", "%%",
                ];
                if name.is_empty() || !OPS.contains(&op.as_str()) {
                    return Err(format!("the expansion ${{{name}{op}…}}"));
                }
                let word_start = self.at;
                let mut depth = 1;
                while let Some(c) = self.peek() {
                    if c == b'{' {
                        depth += 1;
                    } else if c == b'}' {
                        depth -= 1;
                        if depth == 0 {
                            break;
                        }
                    }
                    self.at += 1;
                }
                let inner = &self.text[word_start..self.at];
                self.at += 1;
                let word = Lexer { text: inner, at: 0 }.word()?;
                Ok(Part::Param(name, Some((op, word)), quoted))
            }
            Some(c) if c.is_ascii_digit() || b"@*#?$!-".contains(&c) => {
                self.at += 1;
                Ok(Part::Param((c as char).to_string(), None, quoted))
            }
            Some(c) if c.is_ascii_alphabetic() || c == b'_' => {
                let start = self.at;
                while self
                    .peek()
                    .is_some_and(|c| c.is_ascii_alphanumeric() || c == b'_')
                {
                    self.at += 1;
                }
                Ok(Part::Param(
                    String::from_utf8_lossy(&self.text[start..self.at]).into_owned(),
                    None,
                    quoted,
                ))
            }
            _ => Ok(Part::Lit("$".into(), quoted)),
        }
    }
}

fn utf8_len(first: u8) -> usize {
    match first {
        0xf0.. => 4,
        0xe0.. => 3,
        0xc0.. => 2,
        _ => 1,
    }
}

/// The word as plain text when it is one unquoted literal (a keyword, a name).
fn bare(word: &Word) -> Option<&str> {
    match word.as_slice() {
        [Part::Lit(s, false)] => Some(s),
        _ => None,
    }
}

struct Parser {
    tokens: Vec<Token>,
    at: usize,
}

const STOPS: &[&str] = &["then", "elif", "else", "fi", "do", "done", "esac", "}"];

impl Parser {
    fn new(text: &str) -> Self {
        let tokens = Lexer {
            text: text.as_bytes(),
            at: 0,
        }
        .tokens()
        .unwrap_or_else(|why| vec![Token::Word(vec![Part::Lit(format!("\0{why}"), true)])]);
        Parser { tokens, at: 0 }
    }

    fn program(mut self) -> Result<List, String> {
        if let Some(Token::Word(w)) = self.tokens.first()
            && let [Part::Lit(s, true)] = w.as_slice()
            && let Some(why) = s.strip_prefix('\0')
        {
            return Err(why.to_string());
        }
        let list = self.list(&[])?;
        match self.tokens.get(self.at) {
            None => Ok(list),
            Some(t) => Err(format!("unexpected {t:?}")),
        }
    }

    fn peek_word(&self) -> Option<&str> {
        match self.tokens.get(self.at) {
            Some(Token::Word(w)) => bare(w),
            _ => None,
        }
    }

    fn skip_newlines(&mut self) {
        while matches!(self.tokens.get(self.at), Some(Token::Newline)) {
            self.at += 1;
        }
    }

    fn expect(&mut self, keyword: &str) -> Result<(), String> {
        self.skip_newlines();
        if self.peek_word() == Some(keyword) {
            self.at += 1;
            Ok(())
        } else {
            Err(format!("`{keyword}` expected"))
        }
    }

    /// Commands up to one of `until` (a keyword) or `;;`, `)` or the end.
    fn list(&mut self, until: &[&str]) -> Result<List, String> {
        let mut list = Vec::new();
        loop {
            while matches!(
                self.tokens.get(self.at),
                Some(Token::Newline | Token::Op(";" | "&"))
            ) {
                self.at += 1;
            }
            match self.tokens.get(self.at) {
                None | Some(Token::Op(";;" | ")")) => return Ok(list),
                Some(Token::Word(w))
                    if bare(w).is_some_and(|k| until.contains(&k) || STOPS.contains(&k)) =>
                {
                    return Ok(list);
                }
                _ => {}
            }
            list.push(self.and_or()?);
        }
    }

    fn and_or(&mut self) -> Result<AndOr, String> {
        let first = self.pipeline()?;
        let mut rest = Vec::new();
        while let Some(Token::Op(op @ ("&&" | "||"))) = self.tokens.get(self.at) {
            let and = *op == "&&";
            self.at += 1;
            self.skip_newlines();
            rest.push((and, self.pipeline()?));
        }
        Ok((first, rest))
    }

    fn pipeline(&mut self) -> Result<Pipeline, String> {
        let bang = self.peek_word() == Some("!");
        if bang {
            self.at += 1;
        }
        let mut commands = vec![self.command()?];
        while let Some(Token::Op("|")) = self.tokens.get(self.at) {
            self.at += 1;
            self.skip_newlines();
            commands.push(self.command()?);
        }
        Ok(Pipeline { bang, commands })
    }

    fn command(&mut self) -> Result<Command, String> {
        match self.peek_word() {
            Some("if") => {
                self.at += 1;
                let mut arms = Vec::new();
                let mut otherwise = None;
                loop {
                    let cond = self.list(&[])?;
                    self.expect("then")?;
                    let body = self.list(&[])?;
                    arms.push((cond, body));
                    match self.peek_word() {
                        Some("elif") => self.at += 1,
                        Some("else") => {
                            self.at += 1;
                            otherwise = Some(self.list(&[])?);
                            self.expect("fi")?;
                            break;
                        }
                        _ => {
                            self.expect("fi")?;
                            break;
                        }
                    }
                }
                self.redirects_after()?;
                Ok(Command::If { arms, otherwise })
            }
            Some("case") => {
                self.at += 1;
                let word = self.take_word()?;
                self.expect("in")?;
                let mut arms = Vec::new();
                loop {
                    self.skip_newlines();
                    if self.peek_word() == Some("esac") {
                        self.at += 1;
                        break;
                    }
                    if let Some(Token::Op("(")) = self.tokens.get(self.at) {
                        self.at += 1;
                    }
                    let mut patterns = vec![self.take_word()?];
                    while let Some(Token::Op("|")) = self.tokens.get(self.at) {
                        self.at += 1;
                        patterns.push(self.take_word()?);
                    }
                    match self.tokens.get(self.at) {
                        Some(Token::Op(")")) => self.at += 1,
                        _ => return Err("`)` expected after a case pattern".into()),
                    }
                    let body = self.list(&["esac"])?;
                    arms.push((patterns, body));
                    match self.tokens.get(self.at) {
                        Some(Token::Op(";;")) => self.at += 1,
                        _ => {
                            self.expect("esac")?;
                            break;
                        }
                    }
                }
                self.redirects_after()?;
                Ok(Command::Case { word, arms })
            }
            Some("for") => {
                self.at += 1;
                let var = self
                    .peek_word()
                    .ok_or("a name expected after `for`")?
                    .to_string();
                self.at += 1;
                let mut words = Vec::new();
                if self.peek_word() == Some("in") {
                    self.at += 1;
                    while let Some(Token::Word(w)) = self.tokens.get(self.at) {
                        words.push(w.clone());
                        self.at += 1;
                    }
                }
                if let Some(Token::Op(";")) = self.tokens.get(self.at) {
                    self.at += 1;
                }
                if words.is_empty() {
                    words.push(vec![Part::Param("@".into(), None, true)]);
                }
                self.expect("do")?;
                let body = self.list(&[])?;
                self.expect("done")?;
                self.redirects_after()?;
                Ok(Command::For { var, words, body })
            }
            Some(k @ ("while" | "until")) => {
                let k = k.to_string();
                self.at += 1;
                self.list(&[])?;
                self.expect("do")?;
                self.list(&[])?;
                self.expect("done")?;
                Ok(Command::Unread(format!("uses a `{k}` loop")))
            }
            Some("{") => {
                self.at += 1;
                let body = self.list(&[])?;
                self.expect("}")?;
                self.redirects_after()?;
                Ok(Command::Group(body))
            }
            _ => {
                if let Some(Token::Op("(")) = self.tokens.get(self.at) {
                    self.at += 1;
                    self.list(&[])?;
                    match self.tokens.get(self.at) {
                        Some(Token::Op(")")) => self.at += 1,
                        _ => return Err("`)` expected".into()),
                    }
                    return Ok(Command::Unread("uses a subshell".into()));
                }
                // `name() compound`: a function definition.
                if let (Some(name), Some(Token::Op("(")), Some(Token::Op(")"))) = (
                    self.peek_word().map(str::to_string),
                    self.tokens.get(self.at + 1),
                    self.tokens.get(self.at + 2),
                ) {
                    self.at += 3;
                    self.skip_newlines();
                    let body = self.command()?;
                    return Ok(Command::Function(name, Box::new(body)));
                }
                self.simple()
            }
        }
    }

    fn redirects_after(&mut self) -> Result<(), String> {
        while let Some(Token::Redirect(op, target)) = self.tokens.get(self.at) {
            if !harmless_redirect(op, target) {
                return Err(format!("a redirection `{op}` of a compound command"));
            }
            self.at += 1;
        }
        Ok(())
    }

    fn take_word(&mut self) -> Result<Word, String> {
        self.skip_newlines();
        match self.tokens.get(self.at) {
            Some(Token::Word(w)) => {
                let w = w.clone();
                self.at += 1;
                Ok(w)
            }
            other => Err(format!("a word expected, not {other:?}")),
        }
    }

    fn simple(&mut self) -> Result<Command, String> {
        let mut assigns = Vec::new();
        let mut words = Vec::new();
        let mut redirects = Vec::new();
        loop {
            match self.tokens.get(self.at) {
                Some(Token::Word(w)) => {
                    let w = w.clone();
                    self.at += 1;
                    if words.is_empty()
                        && let Some(Part::Lit(first, false)) = w.first()
                        && let Some((name, value)) = first.split_once('=')
                        && !name.is_empty()
                        && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
                    {
                        let mut value_word = vec![Part::Lit(value.to_string(), false)];
                        value_word.extend(w[1..].iter().cloned());
                        assigns.push((name.to_string(), value_word));
                    } else {
                        words.push(w);
                    }
                }
                Some(Token::Redirect(op, target)) => {
                    redirects.push((op.clone(), target.clone()));
                    self.at += 1;
                }
                _ => break,
            }
        }
        if words.is_empty() && assigns.is_empty() && redirects.is_empty() {
            return Err(format!(
                "a command expected, not {:?}",
                self.tokens.get(self.at)
            ));
        }
        Ok(Command::Simple {
            assigns,
            words,
            redirects,
        })
    }
}

/// A redirection that writes nowhere in the image: to /dev/null or another descriptor.
fn harmless_redirect(op: &str, target: &Word) -> bool {
    let text: String = target
        .iter()
        .map(|p| match p {
            Part::Lit(s, _) => s.as_str(),
            _ => "\u{1}",
        })
        .collect();
    text == "/dev/null"
        || (op.ends_with('&') && text.bytes().all(|b| b.is_ascii_digit() || b == b'-'))
}

// ---- evaluation ------------------------------------------------------------------------

enum Flow {
    Next(i32),
    Exit(i32),
    Return(i32),
    Stop(String),
}

struct Shell<'a> {
    world: &'a dyn World,
    vars: BTreeMap<String, String>,
    args: Vec<String>,
    functions: BTreeMap<String, Command>,
    errexit: bool,
    status: i32,
    effects: Vec<Effect>,
    depth: usize,
    lenient: bool,
    skipped: Vec<String>,
}

/// A word's expansion: fields, or what stops the evaluation.
type Fields = Result<Vec<String>, String>;

impl Shell<'_> {
    /// A command gpubake does not model: in a lenient evaluation it is skipped as if it
    /// succeeded and changed nothing; otherwise the evaluation stops at it.
    fn unmodelled(&mut self, argv: &[String]) -> Flow {
        self.skip_or_stop(format!("runs `{}`", argv.join(" ")))
    }

    /// Whether the image has the administrator's command `name` (in /usr/sbin or /sbin).
    fn installed(&self, name: &str) -> bool {
        ["/usr/sbin", "/sbin"]
            .iter()
            .any(|d| self.world.kind(&format!("{d}/{name}"), true).is_some())
    }

    fn skip_or_stop(&mut self, what: String) -> Flow {
        if self.lenient {
            self.skipped.push(what);
            Flow::Next(0)
        } else {
            Flow::Stop(what)
        }
    }

    fn list(&mut self, list: &List, tested: bool) -> Flow {
        for item in list {
            match self.and_or(item, tested) {
                Flow::Next(_) => {}
                other => return other,
            }
        }
        Flow::Next(self.status)
    }

    fn and_or(&mut self, (first, rest): &AndOr, tested: bool) -> Flow {
        // Every pipeline but the last is tested (set -e does not apply to it).
        let mut status = match self.pipeline(first, tested || !rest.is_empty()) {
            Flow::Next(s) => s,
            other => return other,
        };
        for (i, (and, next)) in rest.iter().enumerate() {
            if (*and && status != 0) || (!*and && status == 0) {
                continue;
            }
            let last = i + 1 == rest.len();
            status = match self.pipeline(next, tested || !last) {
                Flow::Next(s) => s,
                other => return other,
            };
        }
        self.status = status;
        Flow::Next(status)
    }

    fn pipeline(&mut self, p: &Pipeline, tested: bool) -> Flow {
        let mut status = 0;
        for c in &p.commands {
            status = match self.command(c, tested || p.bang) {
                Flow::Next(s) => s,
                other => return other,
            };
        }
        if p.bang {
            status = i32::from(status == 0);
        }
        self.status = status;
        if status != 0 && self.errexit && !tested && !p.bang {
            return Flow::Exit(status);
        }
        Flow::Next(status)
    }

    fn command(&mut self, c: &Command, tested: bool) -> Flow {
        match c {
            Command::Simple {
                assigns,
                words,
                redirects,
            } => self.simple(assigns, words, redirects),
            Command::If { arms, otherwise } => {
                for (cond, body) in arms {
                    match self.list(cond, true) {
                        Flow::Next(0) => return self.list(body, tested),
                        Flow::Next(_) => {}
                        other => return other,
                    }
                }
                match otherwise {
                    Some(body) => self.list(body, tested),
                    None => Flow::Next(0),
                }
            }
            Command::Case { word, arms } => {
                let subject = match self.expand_one(word) {
                    Ok(s) => s,
                    Err(why) => return Flow::Stop(why),
                };
                for (patterns, body) in arms {
                    for p in patterns {
                        let p = match self.expand_one(p) {
                            Ok(p) => p,
                            Err(why) => return Flow::Stop(why),
                        };
                        if pattern_matches(&p, &subject) {
                            return self.list(body, tested);
                        }
                    }
                }
                Flow::Next(0)
            }
            Command::For { var, words, body } => {
                let mut items = Vec::new();
                for w in words {
                    match self.expand(w) {
                        Ok(f) => items.extend(f),
                        Err(why) => return Flow::Stop(why),
                    }
                }
                if let Some(glob) = items.iter().find(|i| i.contains(['*', '?', '['])) {
                    return self.skip_or_stop(format!("loops over the files {glob}"));
                }
                let mut status = 0;
                for item in items {
                    self.vars.insert(var.clone(), item);
                    status = match self.list(body, tested) {
                        Flow::Next(s) => s,
                        other => return other,
                    };
                }
                Flow::Next(status)
            }
            Command::Group(body) => self.list(body, tested),
            Command::Function(name, body) => {
                self.functions.insert(name.clone(), (**body).clone());
                Flow::Next(0)
            }
            Command::Unread(what) => self.skip_or_stop(what.clone()),
        }
    }

    fn simple(
        &mut self,
        assigns: &[(String, Word)],
        words: &[Word],
        redirects: &[(String, Word)],
    ) -> Flow {
        for (op, target) in redirects {
            if !harmless_redirect(op, target) {
                let target = self.expand_one(target).unwrap_or_else(|_| "…".into());
                return self.skip_or_stop(format!("writes to {target} (`{op}`)"));
            }
        }
        let mut argv = Vec::new();
        for w in words {
            match self.expand(w) {
                Ok(f) => argv.extend(f),
                Err(why) => return Flow::Stop(why),
            }
        }
        for (name, value) in assigns {
            match self.expand_one(value) {
                Ok(v) => {
                    self.vars.insert(name.clone(), v);
                }
                Err(why) => return Flow::Stop(why),
            }
        }
        if argv.is_empty() {
            return Flow::Next(0);
        }
        if let Some(body) = self.functions.get(&argv[0]).cloned() {
            if self.depth > 64 {
                return Flow::Stop(format!("recurses in the function {}", argv[0]));
            }
            let saved = std::mem::replace(&mut self.args, argv[1..].to_vec());
            self.depth += 1;
            let flow = self.command(&body, false);
            self.depth -= 1;
            self.args = saved;
            return match flow {
                Flow::Return(s) | Flow::Next(s) => Flow::Next(s),
                other => other,
            };
        }
        self.run(&argv)
    }

    /// A command that is no function of the script.
    /// A shell builtin or a query; anything else is [`Shell::change`]'s.
    fn run(&mut self, argv: &[String]) -> Flow {
        let args: Vec<&str> = argv[1..].iter().map(String::as_str).collect();
        let ok = |yes: bool| Flow::Next(if yes { 0 } else { 1 });
        match argv[0].as_str() {
            ":" | "true" | "echo" | "printf" | "umask" | "export" | "local" | "readonly" => {
                // `export NAME=value` and `local NAME=value` assign.
                for a in &args {
                    if let Some((k, v)) = a.split_once('=')
                        && matches!(argv[0].as_str(), "export" | "local" | "readonly")
                    {
                        self.vars.insert(k.to_string(), v.to_string());
                    }
                }
                Flow::Next(0)
            }
            "false" => Flow::Next(1),
            "set" => {
                for a in args {
                    if let Some(flags) = a.strip_prefix('-') {
                        if flags.contains('e') {
                            self.errexit = true;
                        }
                    } else if let Some(flags) = a.strip_prefix('+')
                        && flags.contains('e')
                    {
                        self.errexit = false;
                    }
                }
                Flow::Next(0)
            }
            "exit" => Flow::Exit(
                args.first()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(self.status),
            ),
            "return" => Flow::Return(
                args.first()
                    .and_then(|s| s.parse().ok())
                    .unwrap_or(self.status),
            ),
            "shift" => {
                let n = args.first().and_then(|s| s.parse().ok()).unwrap_or(1);
                self.args.drain(..n.min(self.args.len()));
                Flow::Next(0)
            }
            "[" | "test" => {
                let mut a = args.clone();
                if argv[0] == "[" {
                    if a.last() != Some(&"]") {
                        return Flow::Stop("runs `[` without `]`".into());
                    }
                    a.pop();
                }
                match self.test(&a) {
                    Ok(b) => ok(b),
                    Err(why) => Flow::Stop(format!("runs `{}` ({why})", argv.join(" "))),
                }
            }
            "getent" if args.len() == 2 => ok(self.world.getent(args[0], args[1])),
            "command" | "which" if args.len() == 2 && args[0] == "-v" || argv[0] == "which" => {
                let name = args.last().copied().unwrap_or("");
                ok(["/usr/sbin", "/usr/bin", "/sbin", "/bin"].iter().any(|d| {
                    matches!(
                        self.world.kind(&format!("{d}/{name}"), true),
                        Some(Kind::File {
                            executable: true,
                            ..
                        })
                    )
                }))
            }
            "dpkg" if args.first() == Some(&"--compare-versions") && args.len() == 4 => {
                match compare_versions(args[1], args[2], args[3]) {
                    Some(b) => ok(b),
                    None => self.unmodelled(argv),
                }
            }
            "dpkg-maintscript-helper" => {
                match args.first() {
                    Some(&"supports") => Flow::Next(0),
                    // Each helper acts only on an upgrade from an older version; a fresh install
                    // has none ($2 is empty).
                    Some(
                        &("rm_conffile" | "mv_conffile" | "symlink_to_dir" | "dir_to_symlink"),
                    ) if self.args.get(1).is_none_or(String::is_empty) => Flow::Next(0),
                    _ => self.unmodelled(argv),
                }
            }
            _ => self.change(argv, &args),
        }
    }

    /// A command that changes the image, or one whose change an image does without.
    fn change(&mut self, argv: &[String], args: &[&str]) -> Flow {
        match argv[0].as_str() {
            // Removing what a fresh install does not have yet (an upgrade's leftovers) changes
            // nothing; removing what is there is not modelled.
            "rm" => {
                let (flags, paths): (Vec<&str>, Vec<&str>) =
                    args.iter().partition(|a| a.starts_with('-'));
                let force = flags.iter().any(|f| f.contains('f'));
                let known = flags
                    .iter()
                    .all(|f| f[1..].chars().all(|c| matches!(c, 'f' | 'r' | 'R')));
                if known && paths.iter().all(|p| self.world.kind(p, false).is_none()) {
                    Flow::Next(if force || paths.is_empty() { 0 } else { 1 })
                } else {
                    self.unmodelled(argv)
                }
            }
            "mkdir" if args.first() == Some(&"-p") && args.len() > 1 => {
                for path in &args[1..] {
                    match self.world.kind(path, true) {
                        Some(Kind::Dir) => {}
                        None if path.starts_with('/') => self.effects.push(Effect::MakeDir {
                            path: path.to_string(),
                        }),
                        _ => return self.unmodelled(argv),
                    }
                }
                Flow::Next(0)
            }
            // The cache is settled once for the whole image, as libc-bin's trigger does.
            "ldconfig" => Flow::Next(0),
            // Events for the running system's devices, and services started on a running
            // system: an image has neither.
            "udevadm" if args.first() == Some(&"trigger") => Flow::Next(0),
            "invoke-rc.d" => Flow::Next(0),
            "update-alternatives" => self.alternatives(argv),
            "systemd-sysusers" if !args.is_empty() && args.iter().all(|a| !a.starts_with('-')) => {
                self.effects.push(Effect::SysUsers {
                    confs: args.iter().map(|a| a.to_string()).collect(),
                });
                Flow::Next(0)
            }
            "update-rc.d" => {
                let words: Vec<&str> = args
                    .iter()
                    .copied()
                    .filter(|a| !a.starts_with('-'))
                    .collect();
                // With insserv, update-rc.d orders the links by the scripts' dependencies.
                let insserv = self.installed("insserv");
                match words.as_slice() {
                    [name, "defaults"] if !insserv => {
                        self.effects.push(Effect::InitLinks {
                            name: name.to_string(),
                        });
                        Flow::Next(0)
                    }
                    _ => self.unmodelled(argv),
                }
            }
            "addgroup" => self.group(argv),
            "adduser" => self.user(argv),
            "dpkg-statoverride" => self.statoverride(argv),
            "chmod" | "chgrp" | "chown" => self.ownership(argv),
            _ => self.unmodelled(argv),
        }
    }

    fn alternatives(&mut self, argv: &[String]) -> Flow {
        let mut args: Vec<&str> = argv[1..]
            .iter()
            .map(String::as_str)
            .filter(|a| !matches!(*a, "--quiet" | "--verbose" | "--force"))
            .collect();
        match args.first().copied() {
            Some("--install") if args.len() >= 5 => {
                let Ok(priority) = args[4].parse::<i64>() else {
                    return self.unmodelled(argv);
                };
                let mut slaves = Vec::new();
                let mut rest = args.split_off(5);
                while !rest.is_empty() {
                    if rest[0] != "--slave" || rest.len() < 4 {
                        return self.unmodelled(argv);
                    }
                    slaves.push(Slave {
                        link: rest[1].into(),
                        name: rest[2].into(),
                        path: rest[3].into(),
                    });
                    rest.drain(..4);
                }
                self.effects.push(Effect::Alternative {
                    link: args[1].into(),
                    name: args[2].into(),
                    path: args[3].into(),
                    priority,
                    slaves,
                });
                Flow::Next(0)
            }
            Some("--remove") if args.len() == 3 => {
                self.effects.push(Effect::RemoveAlternative {
                    name: args[1].into(),
                    path: args[2].into(),
                });
                Flow::Next(0)
            }
            _ => self.unmodelled(argv),
        }
    }

    fn user(&mut self, argv: &[String]) -> Flow {
        if !self.installed("adduser") {
            return Flow::Next(127);
        }
        let mut system = false;
        let mut create_home = true;
        let (mut uid, mut home, mut shell, mut gecos) = (None, None, None, String::new());
        let mut group = UserGroup::None;
        let mut names = Vec::new();
        let mut args = argv[1..].iter();
        while let Some(a) = args.next() {
            let mut value = || args.next().cloned();
            match a.as_str() {
                "--system" => system = true,
                "--quiet"
                | "-q"
                | "--force-badname"
                | "--allow-bad-names"
                | "--disabled-password"
                | "--disabled-login" => {}
                "--no-create-home" => create_home = false,
                "--group" => group = UserGroup::Own,
                "--ingroup" => match value() {
                    Some(g) => group = UserGroup::Named(g),
                    None => return self.unmodelled(argv),
                },
                "--home" => home = value(),
                "--shell" => shell = value(),
                "--gecos" | "--comment" => gecos = value().unwrap_or_default(),
                "--uid" => match value().and_then(|v| v.parse().ok()) {
                    Some(n) => uid = Some(n),
                    None => return self.unmodelled(argv),
                },
                s if s.starts_with('-') => return self.unmodelled(argv),
                s => names.push(s.to_string()),
            }
        }
        match names.as_slice() {
            [name] if system => {
                let home = home.unwrap_or_else(|| "/nonexistent".into());
                // A home directory adduser would make is a file it writes: not modelled.
                if create_home && home != "/nonexistent" {
                    return self.unmodelled(argv);
                }
                if !self.world.getent("passwd", name)
                    && !self
                        .effects
                        .iter()
                        .any(|e| matches!(e, Effect::SystemUser { name: n, .. } if n == name))
                {
                    self.effects.push(Effect::SystemUser {
                        name: name.clone(),
                        uid,
                        group,
                        home,
                        shell: shell.unwrap_or_else(|| "/usr/sbin/nologin".into()),
                        gecos,
                    });
                }
                Flow::Next(0)
            }
            [user, group] if !system && uid.is_none() && home.is_none() => {
                self.effects.push(Effect::Member {
                    user: user.clone(),
                    group: group.clone(),
                });
                Flow::Next(0)
            }
            _ => self.unmodelled(argv),
        }
    }

    fn group(&mut self, argv: &[String]) -> Flow {
        // adduser is no essential package: without it the script fails as sh would.
        if !self.installed("addgroup") {
            return Flow::Next(127);
        }
        let mut system = false;
        let mut names = Vec::new();
        for a in &argv[1..] {
            match a.as_str() {
                "--system" | "-r" => system = true,
                "--quiet" | "--force-badname" | "--allow-bad-names" | "-f" => {}
                s if s.starts_with('-') => return self.unmodelled(argv),
                s => names.push(s.to_string()),
            }
        }
        match names.as_slice() {
            [name] if system => {
                if !self.world.getent("group", name)
                    && !self
                        .effects
                        .iter()
                        .any(|e| matches!(e, Effect::SystemGroup { name: n } if n == name))
                {
                    self.effects
                        .push(Effect::SystemGroup { name: name.clone() });
                }
                Flow::Next(0)
            }
            _ => self.unmodelled(argv),
        }
    }

    fn statoverride(&mut self, argv: &[String]) -> Flow {
        let args: Vec<&str> = argv[1..]
            .iter()
            .map(String::as_str)
            .filter(|a| !matches!(*a, "--quiet" | "--force" | "--force-all"))
            .collect();
        let listed = |path: &str, effects: &[Effect]| {
            self.world.statoverride(path)
                || effects
                    .iter()
                    .any(|e| matches!(e, Effect::StatOverride { path: p, .. } if p == path))
        };
        match args.as_slice() {
            ["--list", path] => Flow::Next(if listed(path, &self.effects) { 0 } else { 1 }),
            ["--add", rest @ ..]
            | ["--update", "--add", rest @ ..]
            | ["--add", "--update", rest @ ..]
                if rest.len() == 4 =>
            {
                let update = args.contains(&"--update");
                let (user, group, mode, path) = (rest[0], rest[1], rest[2], rest[3]);
                let Ok(mode) = u32::from_str_radix(mode, 8) else {
                    return self.unmodelled(argv);
                };
                if listed(path, &self.effects) {
                    // dpkg-statoverride refuses a second override without --force.
                    return Flow::Next(2);
                }
                self.effects.push(Effect::StatOverride {
                    user: user.into(),
                    group: group.into(),
                    mode,
                    path: path.into(),
                    update,
                });
                Flow::Next(0)
            }
            _ => self.unmodelled(argv),
        }
    }

    fn ownership(&mut self, argv: &[String]) -> Flow {
        let args: Vec<&str> = argv[1..].iter().map(String::as_str).collect();
        let [what, path] = args.as_slice() else {
            return self.unmodelled(argv);
        };
        if !path.starts_with('/') || self.world.kind(path, true).is_none() {
            // The command would fail: a relative path has no meaning here, a missing file
            // none either.
            return Flow::Next(1);
        }
        let effect = match argv[0].as_str() {
            "chmod" => Effect::Chmod {
                mode: what.to_string(),
                path: path.to_string(),
            },
            "chgrp" => Effect::Chown {
                user: None,
                group: Some(what.to_string()),
                path: path.to_string(),
            },
            _ => {
                let (user, group) = match what.split_once([':', '.']) {
                    Some((u, g)) => (u, Some(g.to_string())),
                    None => (*what, None),
                };
                Effect::Chown {
                    user: (!user.is_empty()).then(|| user.to_string()),
                    group,
                    path: path.to_string(),
                }
            }
        };
        self.effects.push(effect);
        Flow::Next(0)
    }

    fn test(&self, a: &[&str]) -> Result<bool, String> {
        if let Some(i) = a.iter().position(|x| *x == "-o") {
            return Ok(self.test(&a[..i])? || self.test(&a[i + 1..])?);
        }
        if let Some(i) = a.iter().position(|x| *x == "-a") {
            return Ok(self.test(&a[..i])? && self.test(&a[i + 1..])?);
        }
        let number = |s: &str| {
            s.trim()
                .parse::<i64>()
                .map_err(|_| format!("`{s}` is no number"))
        };
        match a {
            [] => Ok(false),
            ["!", rest @ ..] => Ok(!self.test(rest)?),
            [s] => Ok(!s.is_empty()),
            ["-z", s] => Ok(s.is_empty()),
            ["-n", s] => Ok(!s.is_empty()),
            [op, path] if op.len() == 2 && op.starts_with('-') => {
                let follow = !matches!(*op, "-L" | "-h");
                let kind = self.world.kind(path, follow);
                Ok(match *op {
                    "-e" => kind.is_some(),
                    "-f" => matches!(kind, Some(Kind::File { .. })),
                    "-d" => kind == Some(Kind::Dir),
                    "-x" => matches!(
                        kind,
                        Some(Kind::File {
                            executable: true,
                            ..
                        }) | Some(Kind::Dir)
                    ),
                    "-s" => matches!(
                        kind,
                        Some(Kind::File { empty: false, .. }) | Some(Kind::Dir)
                    ),
                    "-L" | "-h" => kind == Some(Kind::Symlink),
                    "-r" | "-w" => kind.is_some(),
                    _ => return Err(format!("the test `{op}`")),
                })
            }
            [x, "=" | "==", y] => Ok(x == y),
            [x, "!=", y] => Ok(x != y),
            [x, op, y] => {
                let (x, y) = (number(x)?, number(y)?);
                Ok(match *op {
                    "-eq" => x == y,
                    "-ne" => x != y,
                    "-lt" => x < y,
                    "-le" => x <= y,
                    "-gt" => x > y,
                    "-ge" => x >= y,
                    _ => return Err(format!("the test `{op}`")),
                })
            }
            _ => Err(format!("the test `{}`", a.join(" "))),
        }
    }

    fn param(&self, name: &str) -> Option<String> {
        match name {
            "#" => Some(self.args.len().to_string()),
            "?" => Some(self.status.to_string()),
            "@" | "*" => Some(self.args.join(" ")),
            "0" => Some("/bin/sh".into()),
            n if n.bytes().all(|b| b.is_ascii_digit()) => {
                let i: usize = n.parse().ok()?;
                self.args.get(i - 1).cloned()
            }
            n => self.vars.get(n).cloned(),
        }
    }

    fn expand_one(&mut self, word: &Word) -> Result<String, String> {
        Ok(self.expand(word)?.join(" "))
    }

    /// The fields of a word: unquoted expansions split at blanks, quoted ones do not; `"$@"`
    /// is one field per argument.
    fn expand(&mut self, word: &Word) -> Fields {
        let mut fields: Vec<String> = Vec::new();
        let mut current = String::new();
        let mut have = false;
        for part in word {
            match part {
                Part::Lit(s, quoted) => {
                    current.push_str(s);
                    have |= *quoted || !s.is_empty();
                }
                Part::Subst(text) => {
                    let what = format!(
                        "runs `$({})` (a command substitution)",
                        text.trim_matches(['(', ')'])
                    );
                    if !self.lenient {
                        return Err(what);
                    }
                    // Taken as printing nothing.
                    self.skipped.push(what);
                }
                Part::Param(name, op, quoted) => {
                    if name == "@" && *quoted && op.is_none() {
                        let args = self.args.clone();
                        for (i, a) in args.iter().enumerate() {
                            current.push_str(a);
                            if i + 1 < args.len() {
                                fields.push(std::mem::take(&mut current));
                            }
                            have = true;
                        }
                        continue;
                    }
                    let value = self.param(name);
                    let value = match op {
                        None => value.unwrap_or_default(),
                        Some((op, alt)) => {
                            let unset = value.is_none()
                                || (op.starts_with(':') && value.as_deref() == Some(""));
                            match op.trim_start_matches(':') {
                                "-" if unset => self.expand_one(alt)?,
                                "=" if unset => {
                                    let v = self.expand_one(alt)?;
                                    self.vars.insert(name.clone(), v.clone());
                                    v
                                }
                                "+" if !unset => self.expand_one(alt)?,
                                "+" => String::new(),
                                "?" if unset => {
                                    return Err(format!("stops at the unset ${{{name}{op}…}}"));
                                }
                                trim @ ("#" | "##" | "%" | "%%") => {
                                    let pattern = self.expand_one(alt)?;
                                    trimmed(&value.unwrap_or_default(), trim, &pattern)
                                }
                                _ => value.unwrap_or_default(),
                            }
                        }
                    };
                    if *quoted {
                        current.push_str(&value);
                        have = true;
                    } else {
                        let mut pieces = value.split_whitespace().peekable();
                        if value.starts_with(char::is_whitespace) && have {
                            fields.push(std::mem::take(&mut current));
                            have = false;
                        }
                        while let Some(p) = pieces.next() {
                            current.push_str(p);
                            have = true;
                            if pieces.peek().is_some() {
                                fields.push(std::mem::take(&mut current));
                            }
                        }
                        if value.ends_with(char::is_whitespace) && have {
                            fields.push(std::mem::take(&mut current));
                            have = false;
                        }
                    }
                }
            }
        }
        if have {
            fields.push(current);
        }
        Ok(fields)
    }
}

/// `${VAR#PATTERN}` and its kin: the value without the shortest (`#`, `%`) or longest (`##`,
/// `%%`) prefix (`#`) or suffix (`%`) the pattern matches.
fn trimmed(value: &str, op: &str, pattern: &str) -> String {
    let cuts: Vec<usize> = (0..=value.len())
        .filter(|i| value.is_char_boundary(*i))
        .collect();
    let prefix = |i: &&usize| pattern_matches(pattern, &value[..**i]);
    let suffix = |i: &&usize| pattern_matches(pattern, &value[**i..]);
    let found = match op {
        "#" => cuts.iter().find(prefix).map(|&i| &value[i..]),
        "##" => cuts.iter().rev().find(prefix).map(|&i| &value[i..]),
        "%" => cuts.iter().rev().find(suffix).map(|&i| &value[..i]),
        _ => cuts.iter().find(suffix).map(|&i| &value[..i]),
    };
    found.unwrap_or(value).to_string()
}

/// A `case` pattern against a subject: `*`, `?` and literal text.
fn pattern_matches(pattern: &str, subject: &str) -> bool {
    fn m(p: &[u8], s: &[u8]) -> bool {
        match p.first() {
            None => s.is_empty(),
            Some(b'*') => (0..=s.len()).any(|i| m(&p[1..], &s[i..])),
            Some(b'?') => !s.is_empty() && m(&p[1..], &s[1..]),
            Some(c) => s.first() == Some(c) && m(&p[1..], &s[1..]),
        }
    }
    m(pattern.as_bytes(), subject.as_bytes())
}

/// `dpkg --compare-versions A OP B`. An empty version is the earliest of all, except with the
/// `-nl` operators, where it is the latest.
fn compare_versions(a: &str, op: &str, b: &str) -> Option<bool> {
    use std::cmp::Ordering;
    let (op, empty_is_latest) = match op.strip_suffix("-nl") {
        Some(op) => (op, true),
        None => (op, false),
    };
    let ord = match (a.is_empty(), b.is_empty()) {
        (true, true) => Ordering::Equal,
        (true, false) if empty_is_latest => Ordering::Greater,
        (true, false) => Ordering::Less,
        (false, true) if empty_is_latest => Ordering::Less,
        (false, true) => Ordering::Greater,
        (false, false) => {
            let a: debversion::Version = a.parse().ok()?;
            let b: debversion::Version = b.parse().ok()?;
            a.cmp(&b)
        }
    };
    Some(match op {
        "lt" | "<<" => ord == Ordering::Less,
        "le" | "<=" => ord != Ordering::Greater,
        "eq" | "=" => ord == Ordering::Equal,
        "ne" => ord != Ordering::Equal,
        "ge" | ">=" => ord != Ordering::Less,
        "gt" | ">>" => ord == Ordering::Greater,
        _ => return None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Default)]
    struct Image {
        files: BTreeMap<String, Kind>,
        groups: Vec<String>,
        overrides: Vec<String>,
    }

    impl World for Image {
        fn kind(&self, path: &str, _follow: bool) -> Option<Kind> {
            self.files.get(path).copied()
        }
        fn getent(&self, database: &str, name: &str) -> bool {
            database == "group" && self.groups.iter().any(|g| g == name)
        }
        fn statoverride(&self, path: &str) -> bool {
            self.overrides.iter().any(|p| p == path)
        }
    }

    fn exe() -> Kind {
        Kind::File {
            executable: true,
            empty: false,
        }
    }

    fn with_adduser() -> Image {
        let mut image = Image::default();
        image.files.insert("/usr/sbin/addgroup".into(), exe());
        image.files.insert("/usr/sbin/adduser".into(), exe());
        image
    }

    #[test]
    fn addgroup_without_adduser_fails_as_sh_would() {
        let out = evaluate(
            "set -e\naddgroup --system rdma\n",
            &["configure", ""],
            "p",
            &Image::default(),
            false,
        );
        assert_eq!((out.status, out.effects), (127, vec![]));
    }

    /// openssh-client's postinst of Debian bookworm, as shipped.
    const OPENSSH_POSTINST: &str = r#"#!/bin/sh
set -e

action="$1"
umask 022

update_ssh_group_name() {
	if getent group ssh >/dev/null && ! getent group _ssh >/dev/null; then
		groupmod -n _ssh ssh
	fi
}

set_ssh_agent_permissions() {
	if ! getent group _ssh >/dev/null; then
		addgroup --system --quiet --force-badname _ssh
	fi
	if ! dpkg-statoverride --list /usr/bin/ssh-agent >/dev/null; then
		chgrp _ssh /usr/bin/ssh-agent
		chmod 2755 /usr/bin/ssh-agent
	fi
}

remove_obsolete_alternatives() {
	update-alternatives --remove rcp /usr/bin/scp
	update-alternatives --remove rlogin /usr/bin/slogin
	update-alternatives --remove rsh /usr/bin/ssh
}

if [ "$action" = configure ]; then
	# Rename the ssh group to _ssh (#990456).
	if dpkg --compare-versions "$2" lt-nl 1:8.4p1-6~; then
		update_ssh_group_name
	fi
	set_ssh_agent_permissions
	if dpkg --compare-versions "$2" lt-nl 1:9.1p1-1~; then
		remove_obsolete_alternatives
	fi
fi

# Automatically added by dh_installdeb/13.11.4
dpkg-maintscript-helper rm_conffile /etc/ssh/moduli 1:7.9p1-8\~ -- "$@"
# End automatically added section

exit 0
"#;

    #[test]
    fn opensshs_postinst_adds_its_group_and_sets_ssh_agent_setgid_on_a_fresh_install() {
        let mut image = with_adduser();
        image.files.insert("/usr/bin/ssh-agent".into(), exe());
        let out = evaluate(
            OPENSSH_POSTINST,
            &["configure", ""],
            "openssh-client",
            &image,
            false,
        );
        assert_eq!(out.unmodelled, None);
        assert_eq!(out.status, 0);
        assert_eq!(
            out.effects,
            [
                Effect::SystemGroup {
                    name: "_ssh".into()
                },
                Effect::Chown {
                    user: None,
                    group: Some("_ssh".into()),
                    path: "/usr/bin/ssh-agent".into()
                },
                Effect::Chmod {
                    mode: "2755".into(),
                    path: "/usr/bin/ssh-agent".into()
                },
            ]
        );
        // With the group there and an override recorded, nothing is left to do.
        image.groups.push("_ssh".into());
        image.overrides.push("/usr/bin/ssh-agent".into());
        let out = evaluate(
            OPENSSH_POSTINST,
            &["configure", ""],
            "openssh-client",
            &image,
            false,
        );
        assert_eq!((out.effects, out.unmodelled), (vec![], None));
        // An upgrade from before the rename runs the helper that renames the group; `lt-nl`
        // makes the fresh install skip it, an old version takes it.
        image.groups = vec!["ssh".into()];
        let out = evaluate(
            OPENSSH_POSTINST,
            &["configure", "1:8.0p1-1"],
            "openssh-client",
            &image,
            false,
        );
        assert_eq!(
            out.unmodelled.as_deref(),
            Some("runs `groupmod -n _ssh ssh`")
        );
    }

    #[test]
    fn alternatives_with_continuations_and_slaves_are_read_whole() {
        let script = "#!/bin/sh\nset -e\nif [ \"$1\" = \"configure\" ]; then\nupdate-alternatives \\\n\t--install /usr/bin/mpirun mpirun /usr/bin/mpirun.openmpi 50 \\\n\t--slave /usr/bin/mpiexec mpiexec /usr/bin/mpiexec.openmpi \nfi\n";
        let out = evaluate(
            script,
            &["configure", ""],
            "openmpi-bin",
            &Image::default(),
            false,
        );
        assert_eq!(out.unmodelled, None);
        assert_eq!(
            out.effects,
            [Effect::Alternative {
                link: "/usr/bin/mpirun".into(),
                name: "mpirun".into(),
                path: "/usr/bin/mpirun.openmpi".into(),
                priority: 50,
                slaves: vec![Slave {
                    link: "/usr/bin/mpiexec".into(),
                    name: "mpiexec".into(),
                    path: "/usr/bin/mpiexec.openmpi".into()
                }],
            }]
        );
        // The same script run for another action does nothing.
        let out = evaluate(
            script,
            &["abort-upgrade", ""],
            "openmpi-bin",
            &Image::default(),
            false,
        );
        assert_eq!((out.effects, out.unmodelled), (vec![], None));
    }

    #[test]
    fn guards_on_files_and_services_are_judged_against_the_image() {
        // rdma-core's postinst: a service only where its init script is, systemd only on a
        // running system, udev events that an image has no devices for.
        let script = r#"set -e
if [ "$1" = "configure" ] || [ "$1" = "abort-upgrade" ] ; then
	if [ -z "${DPKG_ROOT:-}" ] && [ -x "/etc/init.d/iwpmd" ]; then
		update-rc.d iwpmd defaults >/dev/null
		invoke-rc.d --skip-systemd-native iwpmd start || exit 1
	fi
fi
if [ "$1" = "configure" ]; then
	if [ -d /run/systemd/system ]; then
		systemctl --system daemon-reload >/dev/null || true
	fi
    udevadm trigger --subsystem-match=infiniband --action=change || true
fi
"#;
        let mut image = Image::default();
        let out = evaluate(script, &["configure", ""], "rdma-core", &image, false);
        assert_eq!((out.effects.clone(), out.unmodelled), (vec![], None));
        image.files.insert("/etc/init.d/iwpmd".into(), exe());
        let out = evaluate(script, &["configure", ""], "rdma-core", &image, false);
        assert_eq!(
            (out.effects, out.unmodelled),
            (
                vec![Effect::InitLinks {
                    name: "iwpmd".into()
                }],
                None
            )
        );
        // With insserv, update-rc.d orders the links by dependencies: not modelled.
        image.files.insert("/usr/sbin/insserv".into(), exe());
        let out = evaluate(script, &["configure", ""], "rdma-core", &image, false);
        assert_eq!(
            out.unmodelled.as_deref(),
            Some("runs `update-rc.d iwpmd defaults`")
        );
    }

    #[test]
    fn what_is_not_modelled_stops_the_evaluation_and_is_named() {
        let mut image = with_adduser();
        image.files.insert("/etc/there".into(), exe());
        for (script, named) in [
            (
                "set -e\nsystemd-hwdb --usr update || true\n",
                "runs `systemd-hwdb --usr update`",
            ),
            (
                "x=$(stat -c %d /)\n",
                "runs `$(stat -c %d /)` (a command substitution)",
            ),
            ("echo hi > /etc/motd\n", "writes to /etc/motd (`>`)"),
            ("while true; do :; done\n", "uses a `while` loop"),
            (
                "cat <<EOF\nx\nEOF\n",
                "uses shell syntax gpubake does not read: a here-document",
            ),
            (
                "for f in /etc/x/*; do :; done\n",
                "loops over the files /etc/x/*",
            ),
            (
                "adduser --system --home /run/x sshd\n",
                "runs `adduser --system --home /run/x sshd`",
            ),
            (
                "x=${#y}\n",
                "uses shell syntax gpubake does not read: the expansion ${#…}",
            ),
            ("set -e\nrm -f /etc/there\n", "runs `rm -f /etc/there`"),
        ] {
            let out = evaluate(script, &["configure", ""], "p", &image, false);
            assert_eq!(out.unmodelled.as_deref(), Some(named), "{script}");
        }
    }

    #[test]
    fn a_lenient_evaluation_passes_over_what_is_not_modelled_and_lists_it() {
        // udev's postinst, cut down: the hwdb is built, then groups, then a service started
        // only outside a chroot, which a command substitution tells.
        let script = r#"set -e
chrooted() {
  if [ "$(stat -c %d/%i /)" = "$(stat -Lc %d/%i /proc/1/root 2>/dev/null)" ]; then
    return 1
  fi
  return 0
}
systemd-hwdb --usr update || true
addgroup --quiet --system kvm
if ! chrooted; then
  [ -d /sys/class/ ] || echo "no sysfs"
fi
update-rc.d udev defaults >/dev/null || exit 1
"#;
        let image = with_adduser();
        let strict = evaluate(script, &["configure", ""], "udev", &image, false);
        assert_eq!(
            strict.unmodelled.as_deref(),
            Some("runs `systemd-hwdb --usr update`")
        );
        let out = evaluate(script, &["configure", ""], "udev", &image, true);
        assert_eq!((out.unmodelled, out.status), (None, 0));
        assert_eq!(
            out.skipped,
            [
                "runs `systemd-hwdb --usr update`",
                "runs `$(stat -c %d/%i /)` (a command substitution)",
                "runs `$(stat -Lc %d/%i /proc/1/root 2>/dev/null)` (a command substitution)",
            ]
        );
        assert_eq!(
            out.effects,
            [
                Effect::SystemGroup { name: "kvm".into() },
                Effect::InitLinks {
                    name: "udev".into()
                },
            ]
        );
    }

    #[test]
    fn adduser_makes_a_system_user_with_its_options_or_joins_a_group() {
        let image = with_adduser();
        let script = "set -e\nif ! getent passwd sshd >/dev/null; then\n  adduser --quiet --system --no-create-home --home /run/sshd --shell /usr/sbin/nologin sshd\nfi\nadduser --system --group --uid 120 svc\nadduser svc video\n";
        let out = evaluate(script, &["configure", ""], "openssh-server", &image, false);
        assert_eq!(out.unmodelled, None);
        assert_eq!(
            out.effects,
            [
                Effect::SystemUser {
                    name: "sshd".into(),
                    uid: None,
                    group: UserGroup::None,
                    home: "/run/sshd".into(),
                    shell: "/usr/sbin/nologin".into(),
                    gecos: String::new(),
                },
                Effect::SystemUser {
                    name: "svc".into(),
                    uid: Some(120),
                    group: UserGroup::Own,
                    home: "/nonexistent".into(),
                    shell: "/usr/sbin/nologin".into(),
                    gecos: String::new(),
                },
                Effect::Member {
                    user: "svc".into(),
                    group: "video".into(),
                },
            ]
        );
    }

    #[test]
    fn sysusers_with_the_dpkg_root_idiom_names_its_files() {
        let script = "if [ -z \"${DPKG_ROOT:-}\" ] || [ \"$1\" = configure ]; then\n   systemd-sysusers ${DPKG_ROOT:+--root=\"$DPKG_ROOT\"} basic.conf systemd-network.conf\nfi\n";
        let out = evaluate(
            script,
            &["configure", ""],
            "systemd",
            &Image::default(),
            false,
        );
        assert_eq!(
            (out.effects, out.unmodelled),
            (
                vec![Effect::SysUsers {
                    confs: vec!["basic.conf".into(), "systemd-network.conf".into()]
                }],
                None
            )
        );
        let out = evaluate(
            "systemd-sysusers --cat-config\n",
            &["configure", ""],
            "p",
            &Image::default(),
            false,
        );
        assert_eq!(
            out.unmodelled.as_deref(),
            Some("runs `systemd-sysusers --cat-config`")
        );
    }

    #[test]
    fn removing_what_a_fresh_install_lacks_is_nothing_and_mkdir_makes_what_is_missing() {
        let mut image = Image::default();
        image.files.insert("/var/lib".into(), Kind::Dir);
        let script = "set -e\nrm -f /var/lib/pciutils/pci.ids.old\nmkdir -p /var/lib /var/lib/x\n";
        let out = evaluate(script, &["configure", ""], "p", &image, false);
        assert_eq!(
            (out.status, out.unmodelled, out.effects),
            (
                0,
                None,
                vec![Effect::MakeDir {
                    path: "/var/lib/x".into()
                }]
            )
        );
        // Without -f, rm of a missing file fails as rm would.
        let out = evaluate("set -e\nrm /nope\n", &["configure", ""], "p", &image, false);
        assert_eq!(out.status, 1);
    }

    #[test]
    fn set_e_ends_the_script_at_an_untested_failure_only() {
        let image = with_adduser();
        let script =
            "set -e\nfalse || true\nif false; then :; fi\n! true\nfalse\naddgroup --system late\n";
        let out = evaluate(script, &["configure", ""], "p", &image, false);
        assert_eq!((out.status, out.effects), (1, vec![]));
        let out = evaluate(
            "false\naddgroup --system g\n",
            &["configure", ""],
            "p",
            &image,
            false,
        );
        assert_eq!(out.effects.len(), 1, "without set -e the script goes on");
    }

    #[test]
    fn parameters_quote_and_split_as_sh_does() {
        let image = with_adduser();
        let script = "set -e\naddgroup --system \"r${DPKG_ROOT:+--root=$DPKG_ROOT}\"\np=/usr/lib/x.so.1\naddgroup --system \"${p##*/}-${p%/*}-${p#/usr}-${p%%.*}\"\nv=\"a b\"\nfor x in $v \"$v\" ${unset:-dflt} \"$@\"; do addgroup --system \"g$x\"; done\ncase \"$1\" in\n  conf*|install) addgroup --system case ;;\n  *) exit 3 ;;\nesac\n";
        let out = evaluate(script, &["configure", ""], "p", &image, false);
        let names: Vec<String> = out
            .effects
            .iter()
            .filter_map(|e| match e {
                Effect::SystemGroup { name } => Some(name.clone()),
                _ => None,
            })
            .collect();
        assert_eq!(
            names,
            [
                "r",
                "x.so.1-/usr/lib-/lib/x.so.1-/usr/lib/x",
                "ga",
                "gb",
                "ga b",
                "gdflt",
                "gconfigure",
                "g",
                "case"
            ]
        );
    }

    #[test]
    fn versions_compare_as_dpkg_with_an_empty_one_first_or_last() {
        assert_eq!(
            compare_versions("1:9.2p1-2", "lt", "1:9.1p1-1~"),
            Some(false)
        );
        assert_eq!(compare_versions("1.0~rc1", "lt", "1.0"), Some(true));
        assert_eq!(compare_versions("", "lt", "1.0"), Some(true));
        assert_eq!(compare_versions("", "lt-nl", "1.0"), Some(false));
        assert_eq!(compare_versions("", "gt-nl", "1.0"), Some(true));
        assert_eq!(compare_versions("2", "le", "2"), Some(true));
        assert_eq!(compare_versions("2", "frob", "2"), None);
    }
}
