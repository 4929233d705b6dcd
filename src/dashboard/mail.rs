//! E-mail from the dashboard: the one-time links of open sign-up, handed to
//! the operator's mail server (`[smtp]`) with lettre.
//!
//! Links start with `dashboard.public_url`, never with the request's `Host`:
//! a client chooses its `Host`, and a link to its own server would hand it
//! the token the moment the mailbox owner clicks.

use std::time::Duration;

use lettre::message::header::ContentType;
use lettre::message::Mailbox;
use lettre::transport::smtp::authentication::Credentials;
use lettre::{AsyncSmtpTransport, AsyncTransport, Message, Tokio1Executor};

use crate::access::Email;
use crate::config::{SignUpMail, SmtpSecurity};

/// Sends the dashboard's messages through one mail server.
pub struct Mailer {
    transport: AsyncSmtpTransport<Tokio1Executor>,
    from: Mailbox,
    public_url: reqwest::Url,
    /// Bound on one message, connection included.
    timeout: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum MailError {
    #[error("the address {0} cannot be written in an e-mail")]
    Address(String),
    #[error("building the message: {0}")]
    Build(#[from] lettre::error::Error),
    #[error("the mail server did not take the message: {0}")]
    Send(#[from] lettre::transport::smtp::Error),
    #[error("the mail server did not answer within {0:?}")]
    Timeout(Duration),
}

impl Mailer {
    pub fn new(mail: &SignUpMail<'_>) -> anyhow::Result<Mailer> {
        let s = mail.smtp;
        let builder = match s.security {
            SmtpSecurity::Tls => AsyncSmtpTransport::<Tokio1Executor>::relay(&s.host)?,
            SmtpSecurity::Starttls => {
                AsyncSmtpTransport::<Tokio1Executor>::starttls_relay(&s.host)?
            }
            SmtpSecurity::None => AsyncSmtpTransport::<Tokio1Executor>::builder_dangerous(&s.host),
        };
        let timeout = Duration::from_millis(s.timeout_ms);
        let mut builder = builder
            .port(s.port.unwrap_or(s.security.default_port()))
            .timeout(Some(timeout));
        if let (Some(user), Some(password)) = (&s.username, &s.password) {
            builder = builder.credentials(Credentials::new(user.clone(), password.0.clone()));
        }
        Ok(Mailer {
            transport: builder.build(),
            from: s.from.parse()?,
            public_url: mail.public_url.clone(),
            timeout,
        })
    }

    /// `path` (starting with `/`) under the public address, which may have
    /// a path of its own (`https://example.com/moderato`).
    pub fn link(&self, path: &str) -> String {
        format!("{}{path}", self.public_url.as_str().trim_end_matches('/'))
    }

    /// The link that confirms a sign-up by choosing the account's password.
    pub async fn send_sign_up_link(
        &self,
        to: &Email,
        link_path: &str,
        valid_hours: i64,
    ) -> Result<(), MailError> {
        let body = format!(
            "Someone, probably you, asked for a Moderato account with this address.\n\
             \n\
             To confirm it and choose your password, open this link within {valid_hours} hours:\n\
             \n\
             {}\n\
             \n\
             The link works once. If you did not ask for an account, ignore this\n\
             message: none is made without the link.\n",
            self.link(link_path)
        );
        self.send(to, "Confirm your Moderato sign-up", body).await
    }

    /// What a sign-up for an address that already has an account sends:
    /// the owner hears of it, and the page that answered the sign-up said
    /// nothing about the address.
    pub async fn send_already_registered(&self, to: &Email) -> Result<(), MailError> {
        let body = format!(
            "Someone asked for a Moderato account with this address, which already\n\
             has one. Nothing was changed.\n\
             \n\
             Sign in at {}\n\
             \n\
             If you no longer know your password, ask your administrator for a link\n\
             to set a new one. If it was not you, ignore this message.\n",
            self.link("/dashboard/login")
        );
        self.send(to, "Your Moderato account", body).await
    }

    async fn send(&self, to: &Email, subject: &str, body: String) -> Result<(), MailError> {
        let to: Mailbox = to
            .as_str()
            .parse()
            .map_err(|_| MailError::Address(to.to_string()))?;
        let message = Message::builder()
            .from(self.from.clone())
            .to(to)
            .subject(subject)
            .header(ContentType::TEXT_PLAIN)
            .body(body)?;
        // lettre's timeout bounds each read and write; this bounds them all.
        match tokio::time::timeout(self.timeout, self.transport.send(message)).await {
            Ok(sent) => sent.map(drop).map_err(MailError::from),
            Err(_) => Err(MailError::Timeout(self.timeout)),
        }
    }
}

/// Who may make an account, and how their address is confirmed.
pub enum SignUpDoor {
    Closed,
    /// Open, confirmed by a link sent through this mailer.
    Open(Box<Mailer>),
}

impl SignUpDoor {
    /// From the configuration; an error names a missing mail setting.
    pub fn from_config(config: &crate::config::Config) -> anyhow::Result<SignUpDoor> {
        match config.sign_up_mail()? {
            None => Ok(SignUpDoor::Closed),
            Some(mail) => Ok(SignUpDoor::Open(Box::new(Mailer::new(&mail)?))),
        }
    }

    pub fn is_open(&self) -> bool {
        matches!(self, SignUpDoor::Open(_))
    }
}
