"""What counts as a secret, by its key and by its value.

A setting is secret when its key names one (``sasl.password``, ``s3.secret-access-key``, a JAAS config), when
it is a known credential key of Hadoop, S3A, Azure, GCS or a Hive metastore's JDBC connection
(``fs.s3a.access.key``, ``javax.jdo.option.ConnectionPassword``), when its key ends in an environment-style
name that says so (``spark.kubernetes.driverEnv.DB_PASS``, ``spark.executorEnv.API_TOKEN``), or when its
value carries one whatever the key (a URL with a password in its user info, ``...?password=...``, a PEM
private key, an AWS access key id). Secret settings never go onto a command line, into a log, XCom, a staged
file or a snapshot property: spark-submit gets them in a private properties file, logs get :func:`redact`.

Recognition errs towards secret: a setting taken for one by mistake only travels by the properties file.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

REDACTED = "***"

# Key names that say "secret" in any of the settings we pass on (librdkafka, pyiceberg, Spark, Hadoop).
_SECRET_KEY = re.compile(
    r"password|secret|jaas|token|credential|private|ssl\.key\.pem|api[._-]?key|authorization"
    # Hadoop/S3A/S3N/Azure/GCS credential keys and AWS-style key ids
    r"|access[._-]?key|awsAccessKeyId|fs\.azure\.account\.key|fs\.azure\.sas|oauth2\.client\.(?:id|secret)"
    r"|service\.account\.(?:private\.key|json\.keyfile|keyfile)|encryption\.key"
    # a Hive metastore's JDBC connection (its URL often carries the password too)
    r"|javax\.jdo\.option\.Connection(?:Password|URL)",
    re.I,
)
# An environment-style last segment (``...Env.DB_PASS``): upper-case names that say what they hold.
_ENV_NAME = re.compile(r"(?:^|\.)[A-Z][A-Z0-9_]*(?:PASS|SECRET|TOKEN|KEY|CREDENTIAL|AUTH)[A-Z0-9_]*$")
# Values that carry a secret whatever their key.
_SECRET_VALUE = re.compile(
    r"://[^/\s:@]+:[^/\s@]*@"  # user:password@ in a URL
    r"|(?:password|passwd|pwd|secret|token|credential|sig)=[^&;\s]"  # a query string or a JDBC property
    r"|-----BEGIN [A-Z ]*PRIVATE KEY-----"  # a PEM private key
    r"|\b(?:AKIA|ASIA)[A-Z0-9]{16}\b",  # an AWS access key id
    re.I,
)


def is_secret_key(key: str) -> bool:
    """True when the key alone says the value is secret."""
    return bool(_SECRET_KEY.search(key) or _ENV_NAME.search(key))


def embeds_secret(value: Any) -> bool:
    """True when a value carries a secret whatever its key (a URL with a password, a private key, ...)."""
    return isinstance(value, str) and bool(_SECRET_VALUE.search(value))


def is_secret(key: str, value: Any) -> bool:
    """True when the setting ``key: value`` must be kept out of command lines, logs, XCom and staged files."""
    return is_secret_key(key) or embeds_secret(value)


def redact(settings: Mapping[str, Any]) -> dict[str, Any]:
    """A copy with secret values replaced, safe for logs, XCom and snapshot properties."""
    return {k: (REDACTED if is_secret(k, v) else v) for k, v in settings.items()}


def split_secrets(conf: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(settings safe on a command line, secret settings)."""
    public = {k: v for k, v in conf.items() if not is_secret(k, v)}
    return public, {k: v for k, v in conf.items() if k not in public}


# Spark's own redaction (Spark UI, event logs, ``--verbose``) by the same rules: Spark redacts a setting whose
# key or value matches (its default is (?i)secret|password|token|access[.]key). The patterns above are written in
# the syntax Python and Java regular expressions share, so they are used as they are.
SPARK_REDACTION_REGEX = "(?i)" + "|".join(p.pattern for p in (_SECRET_KEY, _ENV_NAME, _SECRET_VALUE))
