//! The command line: `serve`, key management and the billing report.

use std::path::PathBuf;

use anyhow::Context;
use chrono::NaiveDate;
use clap::{Args, Parser, Subcommand};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::access::allowance::check_own_rpm;
use crate::access::policy::{rules_from_args, rules_to_json};
use crate::access::{
    Account, AccountId, ApiKeyRecord, Email, KeyId, KeyOwner, KeyRequestError, Password, Plan,
    Policy, PolicyDraft, PolicyError, PolicyId, PolicyVersion, Role, Tier,
};
use crate::config::Config;
use crate::moderation::{Category, CategoryRule, Speed};
use crate::store::{AccountKeyInsert, NewAccountKey, Period, Store};

#[derive(Debug, Parser)]
#[command(
    name = "moderato",
    version,
    about = "Self-hostable content moderation API"
)]
pub struct Cli {
    /// A TOML file layered over the built-in defaults (then MODERATO_* variables).
    #[arg(long, global = true, env = "MODERATO_CONFIG")]
    pub config: Option<PathBuf>,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run the HTTP service.
    Serve,
    /// Ask the service this configuration describes whether it is ready
    /// (GET /ready on `addr`): exit 0 when it is, 1 with the reason when
    /// not. The container image's HEALTHCHECK, which has no curl.
    Health,
    /// Manage API keys.
    #[command(subcommand)]
    Keys(KeysCommand),
    /// Billable usage per key and day (or month).
    Usage(UsageArgs),
    /// Manage dashboard accounts.
    #[command(subcommand)]
    Accounts(AccountsCommand),
    /// Manage policies: per-category thresholds of an account's keys.
    #[command(subcommand)]
    Policies(PoliciesCommand),
}

/// The rules of a policy as options: each category at most once.
#[derive(Debug, Args)]
pub struct RuleArgs {
    /// CATEGORY=VALUE: flag the category from VALUE on (0 < VALUE <= 1),
    /// instead of the shipped threshold. Repeatable.
    #[arg(long = "threshold", value_name = "CATEGORY=VALUE")]
    thresholds: Vec<String>,
    /// Never flag CATEGORY. Repeatable.
    #[arg(long = "off", value_name = "CATEGORY")]
    off: Vec<String>,
    /// The text path: `accurate` (both encoders; the default of a new
    /// policy) or `fast` (the first stage alone, for high-volume keys).
    #[arg(long, value_name = "accurate|fast")]
    speed: Option<Speed>,
}

#[derive(Debug, Subcommand)]
pub enum PoliciesCommand {
    /// Create a policy; categories not named keep the shipped thresholds.
    Create {
        #[arg(long)]
        name: String,
        /// The e-mail address of the account; without it, the operator
        /// account (whose keys `keys create --tier` makes).
        #[arg(long)]
        account: Option<String>,
        #[command(flatten)]
        rules: RuleArgs,
        /// Make it the account's default: every key of the account without
        /// a policy of its own is judged by it.
        #[arg(long)]
        default: bool,
        #[arg(long)]
        json: bool,
    },
    /// List an account's policies.
    List {
        #[arg(long)]
        account: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Show a policy and every version of it (who changed it, when).
    Show {
        id: String,
        #[arg(long)]
        account: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Change a policy: its next version, applied by every replica within
    /// a second. The rules given are merged into the current ones.
    Update {
        id: String,
        #[arg(long)]
        account: Option<String>,
        #[arg(long)]
        name: Option<String>,
        #[command(flatten)]
        rules: RuleArgs,
        /// Back to the shipped threshold for CATEGORY. Repeatable.
        #[arg(long = "shipped", value_name = "CATEGORY")]
        shipped: Vec<String>,
        /// Make it the account's default.
        #[arg(long)]
        default: bool,
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum AccountsCommand {
    /// Create an account (the first admin is made this way).
    Create {
        #[arg(long)]
        email: String,
        #[arg(long, value_parser = parse_role)]
        role: Role,
        #[arg(long, value_parser = parse_tier, default_value = "free")]
        tier: Tier,
        /// Requests per minute: required for enterprise, overrides the plan otherwise.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        rpm: Option<u32>,
        /// Read the password from standard input (one line). Without it the
        /// account has no password until one is set.
        #[arg(long)]
        password_stdin: bool,
        #[arg(long)]
        json: bool,
    },
    /// List accounts.
    List {
        #[arg(long)]
        json: bool,
    },
}

#[derive(Debug, Subcommand)]
pub enum KeysCommand {
    /// Create a key and print its secret (shown once): an operator key with
    /// its own plan (--tier), or a key of a customer account (--account),
    /// which shares the account's plan and counts against its cap.
    Create {
        #[arg(long)]
        name: String,
        #[arg(long, value_parser = parse_tier, required_unless_present = "account", conflicts_with = "account")]
        tier: Option<Tier>,
        /// The e-mail address of the customer account that owns the key.
        #[arg(long)]
        account: Option<String>,
        /// Requests per minute. An operator key: required for enterprise,
        /// overrides the plan otherwise. An account's key: a lower limit of
        /// its own, at most the account's.
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        rpm: Option<u32>,
        /// A policy of the key's account (`policies list`); without it the
        /// key follows its account's default policy.
        #[arg(long)]
        policy: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// Revoke a key: every replica refuses it within one second.
    Revoke { id: String },
    /// List keys (never their secrets).
    List {
        #[arg(long)]
        json: bool,
    },
    /// Change a key's plan (and custom limit); takes effect without a restart.
    SetTier {
        id: String,
        #[arg(value_parser = parse_tier)]
        tier: Tier,
        #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
        rpm: Option<u32>,
    },
}

#[derive(Debug, Args)]
pub struct UsageArgs {
    #[arg(long)]
    pub key: Option<String>,
    /// First UTC day to include (YYYY-MM-DD).
    #[arg(long)]
    pub since: Option<NaiveDate>,
    /// `day` or `month`.
    #[arg(long, default_value = "day", value_parser = parse_period)]
    pub period: Period,
    #[arg(long)]
    pub json: bool,
}

fn parse_tier(s: &str) -> Result<Tier, String> {
    s.parse()
}

fn parse_role(s: &str) -> Result<Role, String> {
    s.parse()
}

fn parse_period(s: &str) -> Result<Period, String> {
    match s {
        "day" => Ok(Period::Day),
        "month" => Ok(Period::Month),
        other => Err(format!("unknown period {other:?}: expected day or month")),
    }
}

/// Runs the parsed command. `serve` runs until SIGTERM or Ctrl-C.
pub async fn execute(cli: Cli) -> anyhow::Result<()> {
    let config = Config::load(cli.config.as_deref())?;
    crate::telemetry::init(config.log_format);
    match cli.command {
        Command::Serve => serve(config).await,
        Command::Health => health(&config).await,
        Command::Keys(command) => keys(config, command).await,
        Command::Usage(args) => usage(config, args).await,
        Command::Accounts(command) => accounts(config, command).await,
        Command::Policies(command) => policies(command, &config).await,
    }
}

/// The API's listen backlog (the kernel caps it at `net.core.somaxconn`):
/// deep enough that a burst of connections from one client waits in the
/// queue (to be refused by its cap, or served) rather than having the
/// kernel drop SYNs, which costs every client caught in it a one-second
/// retransmission. tokio's `bind` asks for 1024.
const LISTEN_BACKLOG: u32 = 4096;

fn bind_api(address: std::net::SocketAddr) -> std::io::Result<tokio::net::TcpListener> {
    let socket = match address {
        std::net::SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4()?,
        std::net::SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6()?,
    };
    // As tokio's `bind` does on Unix: a restarted server need not wait for
    // its old connections' TIME_WAIT.
    socket.set_reuseaddr(true)?;
    socket.bind(address)?;
    socket.listen(LISTEN_BACKLOG)
}

async fn serve(config: Config) -> anyhow::Result<()> {
    let listener =
        bind_api(config.addr).with_context(|| format!("cannot listen on {}", config.addr))?;
    let metrics = match config.metrics_addr()? {
        Some(address) => Some(
            tokio::net::TcpListener::bind(address)
                .await
                .with_context(|| format!("cannot listen for metrics on {address} (metrics_addr; empty turns metrics off)"))?,
        ),
        None => None,
    };
    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(shutdown.clone()));
    crate::run_with_metrics(config, listener, metrics, shutdown).await
}

async fn cancel_on_signal(token: CancellationToken) {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let mut terminate =
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(signal) => signal,
                Err(error) => {
                    tracing::error!(%error, "cannot listen for SIGTERM");
                    let _ = ctrl_c.await;
                    token.cancel();
                    return;
                }
            };
        tokio::select! {
            _ = ctrl_c => {}
            _ = terminate.recv() => {}
        }
    }
    #[cfg(not(unix))]
    let _ = ctrl_c.await;
    tracing::info!("shutdown requested: finishing requests in flight");
    token.cancel();
}

/// How long `health` waits for the whole answer: a container runtime runs
/// it every few seconds, so a hung service must fail it, not stack probes.
const HEALTH_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(3);

async fn health(config: &Config) -> anyhow::Result<()> {
    let url = format!("http://{}/ready", probe_address(config.addr));
    // No proxy: the probe is for this host's service, whatever HTTP_PROXY says.
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(HEALTH_TIMEOUT)
        .build()?;
    let response = client
        .get(&url)
        .send()
        .await
        .with_context(|| format!("no answer from {url}"))?;
    let status = response.status();
    anyhow::ensure!(status.is_success(), "{url} answered {status}");
    Ok(())
}

/// Where a local probe reaches a service listening on `addr`: a wildcard
/// address (`0.0.0.0:8080` in the image) is reached on loopback.
fn probe_address(addr: std::net::SocketAddr) -> std::net::SocketAddr {
    match addr.ip() {
        std::net::IpAddr::V4(ip) if ip.is_unspecified() => {
            (std::net::Ipv4Addr::LOCALHOST, addr.port()).into()
        }
        std::net::IpAddr::V6(ip) if ip.is_unspecified() => {
            (std::net::Ipv6Addr::LOCALHOST, addr.port()).into()
        }
        _ => addr,
    }
}

fn parse_key_id(text: &str) -> anyhow::Result<KeyId> {
    KeyId::parse(text).with_context(|| {
        format!("{text:?} is not a key id (16 lower-case hex digits, as `keys list` shows)")
    })
}

async fn keys(config: Config, command: KeysCommand) -> anyhow::Result<()> {
    let store = crate::store::connect(&config.database_url.0).await?;
    match command {
        KeysCommand::Create {
            name,
            account: Some(email),
            rpm,
            policy,
            json,
            ..
        } => {
            let key = NewKeyArgs {
                name,
                rpm,
                policy,
                json,
            };
            create_account_key(&config, store.as_ref(), &email, key).await?
        }
        KeysCommand::Create {
            name,
            tier,
            account: None,
            rpm,
            policy,
            json,
        } => {
            let tier = tier.context("give the key's plan (--tier) or its account (--account)")?;
            let plan = Plan::new(tier, rpm)?;
            let policy_id =
                own_policy(store.as_ref(), &AccountId::operator(), policy.as_deref()).await?;
            let pepper = crate::load_pepper(&config)?;
            let new = crate::access::keys::generate(&pepper);
            let record = ApiKeyRecord {
                id: new.id.clone(),
                name,
                tier,
                custom_rpm: rpm,
                owner: KeyOwner::Operator,
                secret_hash: new.secret_hash,
                created_at: chrono::Utc::now(),
                revoked_at: None,
                policy_id,
                policy: None,
            };
            store.insert_key(&record).await?;
            let limit = plan.rpm(&config.plans);
            if json {
                println!(
                    "{}",
                    json!({ "id": new.id, "key": new.full_key, "tier": tier, "rpm": limit })
                );
            } else {
                println!("id:   {}\ntier: {tier} ({limit} requests/minute)\nkey:  {}\n\nThe key is shown only now: store it safely.", new.id, new.full_key);
            }
        }
        KeysCommand::Revoke { id } => {
            let id = parse_key_id(&id)?;
            if !store.revoke_key(&id).await? {
                anyhow::bail!("no key with id {id}");
            }
            println!("revoked {id}");
        }
        KeysCommand::List { json } => print_keys(&config, &store.list_keys().await?, json),
        KeysCommand::SetTier { id, tier, rpm } => {
            let id = parse_key_id(&id)?;
            let plan = Plan::new(tier, rpm)?;
            if let Some(ApiKeyRecord {
                owner: KeyOwner::Account { .. },
                ..
            }) = store.get_key(&id).await?
            {
                anyhow::bail!("key {id} belongs to a customer account: it has its account's plan (set the account's plan in the dashboard's admin pages)");
            }
            if !store.set_tier(&id, tier, rpm).await? {
                anyhow::bail!("no key with id {id}");
            }
            println!(
                "{id}: tier {tier}, {} requests/minute",
                plan.rpm(&config.plans)
            );
        }
    }
    Ok(())
}

/// What `keys create --account` was given for the key.
struct NewKeyArgs {
    name: String,
    rpm: Option<u32>,
    policy: Option<String>,
    json: bool,
}

/// The policy `--policy` names, checked to be `account`'s own: a policy of
/// another account is refused with the same words as an unknown one.
async fn own_policy(
    store: &dyn Store,
    account: &AccountId,
    policy: Option<&str>,
) -> anyhow::Result<Option<PolicyId>> {
    let Some(text) = policy else {
        return Ok(None);
    };
    let not_here = || PolicyError::NotInAccount {
        field: "--policy".into(),
        id: text.to_owned(),
    };
    let id = PolicyId::parse(text).ok_or_else(not_here)?;
    match store.get_policy(account, &id).await? {
        Some(_) => Ok(Some(id)),
        None => Err(not_here().into()),
    }
}

/// Makes a key for the customer account with e-mail `email`, on its plan,
/// refused past the plan's cap on keys (`max_keys_per_account`).
async fn create_account_key(
    config: &Config,
    store: &dyn Store,
    email: &str,
    args: NewKeyArgs,
) -> anyhow::Result<()> {
    let NewKeyArgs {
        name,
        rpm: own_rpm,
        policy,
        json,
    } = args;
    let email = Email::parse(email)?;
    let account = store
        .account_by_email(&email)
        .await?
        .with_context(|| format!("no account with e-mail {email}"))?;
    if account.id.is_operator() {
        anyhow::bail!(
            "the operator account's keys each have their own plan: use --tier instead of --account"
        );
    }
    if account.is_disabled() {
        anyhow::bail!("the account {email} is disabled: its keys would be refused");
    }
    let plan = account.plan;
    let key_rpm = check_own_rpm(own_rpm, plan.tier(), plan.custom_rpm(), &config.plans)?;
    let policy_id = own_policy(store, &account.id, policy.as_deref()).await?;
    let max_keys = config.max_keys_per_account.of(plan.tier());
    let pepper = crate::load_pepper(config)?;
    let new = crate::access::keys::generate(&pepper);
    let key = NewAccountKey {
        id: new.id.clone(),
        name,
        key_rpm,
        secret_hash: new.secret_hash,
        created_at: chrono::Utc::now(),
        policy_id,
    };
    if store
        .insert_account_key(&account.id, &key, max_keys)
        .await?
        == AccountKeyInsert::AccountFull
    {
        anyhow::bail!(
            "{email}: {}",
            KeyRequestError::TooManyKeys {
                max: max_keys,
                tier: plan.tier()
            }
        );
    }
    let tier = plan.tier();
    let limit = key_rpm
        .unwrap_or(plan.rpm(&config.plans))
        .min(plan.rpm(&config.plans));
    if json {
        println!(
            "{}",
            json!({ "id": new.id, "key": new.full_key, "tier": tier, "rpm": limit, "account": account.id })
        );
    } else {
        println!("id:      {}\naccount: {email} (all its keys share its allowance)\ntier:    {tier} ({limit} requests/minute)\nkey:     {}\n\nThe key is shown only now: store it safely.", new.id, new.full_key);
    }
    Ok(())
}

fn print_keys(config: &Config, keys: &[ApiKeyRecord], as_json: bool) {
    let rows: Vec<serde_json::Value> = keys
        .iter()
        .map(|k| {
            json!({
                "id": k.id,
                "name": k.name,
                "tier": k.tier,
                "rpm": k.effective_rpm(&config.plans),
                "account": match &k.owner {
                    KeyOwner::Operator => None,
                    KeyOwner::Account { id, .. } => Some(id),
                },
                "created_at": k.created_at,
                "revoked_at": k.revoked_at,
                // What it is judged by: its own policy, else its account's default.
                "policy": k.policy.as_ref().map(|p| json!({"id": p.id, "name": p.name, "version": p.version})),
            })
        })
        .collect();
    if as_json {
        println!("{}", serde_json::Value::Array(rows));
        return;
    }
    println!(
        "{:<16}  {:<10}  {:>6}  {:<8}  name",
        "id", "tier", "rpm", "status"
    );
    for (key, row) in keys.iter().zip(&rows) {
        let status = if key.revoked_at.is_some() {
            "revoked"
        } else {
            "active"
        };
        println!(
            "{:<16}  {:<10}  {:>6}  {:<8}  {}",
            key.id, key.tier, row["rpm"], status, key.name
        );
    }
}

async fn accounts(config: Config, command: AccountsCommand) -> anyhow::Result<()> {
    let store = crate::store::connect(&config.database_url.0).await?;
    match command {
        AccountsCommand::Create {
            email,
            role,
            tier,
            rpm,
            password_stdin,
            json,
        } => {
            let email = Email::parse(&email)?;
            let plan = Plan::new(tier, rpm)?;
            let password_hash = if password_stdin {
                let password = Password::new(read_password_line()?)?;
                Some(tokio::task::spawn_blocking(move || password.hash()).await?)
            } else {
                None
            };
            let account = Account::new(email, role, plan, password_hash);
            match store.insert_account(&account).await {
                Err(crate::store::StoreError::Conflict(_)) => {
                    anyhow::bail!("an account with e-mail {} already exists", account.email)
                }
                other => other?,
            }
            if json {
                println!(
                    "{}",
                    json!({ "id": account.id, "email": account.email, "role": account.role })
                );
            } else {
                println!(
                    "created {} account {} ({}), plan {tier} ({} requests/minute)",
                    account.role,
                    account.email,
                    account.id,
                    plan.rpm(&config.plans)
                );
            }
        }
        AccountsCommand::List { json } => {
            let listings = store.list_accounts().await?;
            print_accounts(&config, &listings, json);
        }
    }
    Ok(())
}

/// One line of standard input, without its line ending.
fn read_password_line() -> anyhow::Result<String> {
    let mut line = String::new();
    std::io::stdin()
        .read_line(&mut line)
        .context("reading the password from standard input")?;
    Ok(line.trim_end_matches(['\r', '\n']).to_owned())
}

fn print_accounts(config: &Config, listings: &[crate::store::AccountListing], as_json: bool) {
    if as_json {
        let rows: Vec<serde_json::Value> = listings
            .iter()
            .map(|l| {
                let a = &l.account;
                json!({
                    "id": a.id,
                    "email": a.email,
                    "role": a.role,
                    "tier": a.plan.tier(),
                    "rpm": a.plan.rpm(&config.plans),
                    "disabled_at": a.disabled_at,
                    "awaiting_confirmation": a.awaiting_confirmation,
                    "created_at": a.created_at,
                    "last_activity": l.last_activity,
                })
            })
            .collect();
        println!("{}", serde_json::Value::Array(rows));
        return;
    }
    println!(
        "{:<36}  {:<8}  {:<10}  {:>6}  {:<11}  email",
        "id", "role", "tier", "rpm", "status"
    );
    for l in listings {
        let a = &l.account;
        let status = if a.is_disabled() {
            "disabled"
        } else if a.awaiting_confirmation {
            "unconfirmed"
        } else {
            "active"
        };
        println!(
            "{:<36}  {:<8}  {:<10}  {:>6}  {:<11}  {}",
            a.id,
            // as_str: Display ignores the column width.
            a.role.as_str(),
            a.plan.tier().as_str(),
            a.plan.rpm(&config.plans),
            status,
            a.email
        );
    }
}

async fn usage(config: Config, args: UsageArgs) -> anyhow::Result<()> {
    let store: std::sync::Arc<dyn Store> = crate::store::connect(&config.database_url.0).await?;
    let key = args.key.as_deref().map(parse_key_id).transpose()?;
    let rows = store.billing(args.period, key.as_ref(), args.since).await?;
    if args.json {
        println!("{}", serde_json::to_string(&rows)?);
        return Ok(());
    }
    println!(
        "{:<16}  {:<10}  {:>9}  {:>10}  {:>12}  {:>11}  {:>13}  {:>12}",
        "key",
        "period",
        "requests",
        "text_items",
        "text_chars",
        "image_items",
        "deep_analyses",
        "rate_limited"
    );
    for r in rows {
        println!(
            "{:<16}  {:<10}  {:>9}  {:>10}  {:>12}  {:>11}  {:>13}  {:>12}",
            r.key_id,
            r.period_start,
            r.requests,
            r.text_items,
            r.text_chars,
            r.image_items,
            r.deep_analyses,
            r.rate_limited
        );
    }
    Ok(())
}

/// Who the command line is in a policy's history.
const CLI_AUTHOR: &str = "cli";

/// The account `--account` names, else the operator account.
async fn policy_account(store: &dyn Store, email: Option<&str>) -> anyhow::Result<AccountId> {
    let Some(email) = email else {
        return Ok(AccountId::operator());
    };
    let email = Email::parse(email)?;
    let account = store
        .account_by_email(&email)
        .await?
        .with_context(|| format!("--account: no account with e-mail {email}"))?;
    Ok(account.id)
}

/// The account's policy `id`; unknown and another account's alike are "not
/// in this account".
async fn find_policy(store: &dyn Store, account: &AccountId, id: &str) -> anyhow::Result<Policy> {
    let not_here = || PolicyError::NotInAccount {
        field: "ID".into(),
        id: id.to_owned(),
    };
    let parsed = PolicyId::parse(id).ok_or_else(not_here)?;
    Ok(store
        .get_policy(account, &parsed)
        .await?
        .ok_or_else(not_here)?)
}

async fn policies(command: PoliciesCommand, config: &Config) -> anyhow::Result<()> {
    let store = crate::store::connect(&config.database_url.0).await?;
    let store = store.as_ref();
    match command {
        PoliciesCommand::Create {
            name,
            account,
            rules,
            default,
            json,
        } => {
            let account = policy_account(store, account.as_deref()).await?;
            let draft = PolicyDraft {
                name: crate::access::policy::policy_name(&name)?,
                rules: rules_from_args(&rules.thresholds, &rules.off)?,
                speed: rules.speed.unwrap_or_default(),
                changed_by: CLI_AUTHOR.into(),
            };
            let id = PolicyId::new_random();
            match store
                .insert_policy(&account, &id, &draft, default, chrono::Utc::now())
                .await
            {
                Err(crate::store::StoreError::Conflict(_)) => {
                    anyhow::bail!(
                        "--name: the account already has a policy named {:?}",
                        draft.name
                    )
                }
                other => other?,
            }
            let policy = find_policy(store, &account, id.as_str()).await?;
            print_policy(&policy, None, json);
        }
        PoliciesCommand::List { account, json } => {
            let account = policy_account(store, account.as_deref()).await?;
            let policies = store.account_policies(&account).await?;
            if json {
                let rows: Vec<_> = policies.iter().map(|p| policy_json(p, None)).collect();
                println!("{}", serde_json::Value::Array(rows));
            } else {
                println!("{:<36}  {:>7}  {:<7}  name", "id", "version", "default");
                for p in &policies {
                    let default = if p.is_default { "yes" } else { "" };
                    println!("{:<36}  {:>7}  {:<7}  {}", p.id, p.version, default, p.name);
                }
            }
        }
        PoliciesCommand::Show { id, account, json } => {
            let account = policy_account(store, account.as_deref()).await?;
            let policy = find_policy(store, &account, &id).await?;
            let history = store.policy_history(&account, &policy.id).await?;
            print_policy(&policy, Some(&history), json);
        }
        PoliciesCommand::Update {
            id,
            account,
            name,
            rules,
            shipped,
            default,
            json,
        } => {
            let account = policy_account(store, account.as_deref()).await?;
            let policy = find_policy(store, &account, &id).await?;
            let mut merged = policy.rules;
            for (category, rule) in rules_from_args(&rules.thresholds, &rules.off)?.iter() {
                merged.set(category, Some(rule));
            }
            for name in &shipped {
                merged.set(crate::access::policy::category("--shipped", name)?, None);
            }
            let draft = PolicyDraft {
                name: match name {
                    Some(name) => crate::access::policy::policy_name(&name)?,
                    None => policy.name.clone(),
                },
                rules: merged,
                speed: rules.speed.unwrap_or(policy.speed),
                changed_by: CLI_AUTHOR.into(),
            };
            match store
                .update_policy(&account, &policy.id, &draft, chrono::Utc::now())
                .await
            {
                Err(crate::store::StoreError::Conflict(_)) => {
                    anyhow::bail!(
                        "--name: the account already has a policy named {:?}",
                        draft.name
                    )
                }
                other => other?,
            };
            if default {
                store.set_default_policy(&account, Some(&policy.id)).await?;
            }
            let policy = find_policy(store, &account, policy.id.as_str()).await?;
            print_policy(&policy, None, json);
        }
    }
    Ok(())
}

fn version_json(v: &PolicyVersion) -> serde_json::Value {
    json!({
        "version": v.version,
        "name": v.name,
        "rules": rules_to_json(&v.rules),
        "speed": v.speed,
        "changed_by": v.changed_by,
        "changed_at": v.changed_at,
    })
}

fn policy_json(p: &Policy, history: Option<&[PolicyVersion]>) -> serde_json::Value {
    let mut value = json!({
        "id": p.id,
        "name": p.name,
        "version": p.version,
        "account": p.account_id,
        "default": p.is_default,
        "rules": rules_to_json(&p.rules),
        "speed": p.speed,
        "created_at": p.created_at,
        "updated_at": p.updated_at,
    });
    if let Some(history) = history {
        value["history"] = history.iter().map(version_json).collect();
    }
    value
}

fn print_policy(p: &Policy, history: Option<&[PolicyVersion]>, as_json: bool) {
    if as_json {
        println!("{}", policy_json(p, history));
        return;
    }
    let default = if p.is_default {
        " (the account's default)"
    } else {
        ""
    };
    println!(
        "id:      {}\nname:    {}{default}\nversion: {}\nspeed:   {}",
        p.id, p.name, p.version, p.speed
    );
    for category in Category::ALL {
        let rule = match p.rules.get(category) {
            None => "shipped".to_owned(),
            Some(CategoryRule::Off) => "off".to_owned(),
            Some(CategoryRule::Threshold(t)) => t.to_string(),
        };
        println!("  {:<24} {rule}", category.as_str());
    }
    for v in history.unwrap_or_default() {
        println!(
            "version {} by {} at {}",
            v.version,
            v.changed_by,
            v.changed_at.format("%Y-%m-%d %H:%M:%S UTC")
        );
    }
}
