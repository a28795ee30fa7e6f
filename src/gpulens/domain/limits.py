"""Every bound on what a caller may send, in one table: the API's models, the services' checks and
the CLI's options read these, so a limit is changed here and nowhere else (stdlib only).

Lengths are in characters. The patterns built from them live in `domain/models.py` and
`domain/workloads.py`; the table columns in `storage/tables.py` are at least as wide.
"""

from __future__ import annotations

__all__ = [
    "ACTIVE_EXECUTIONS_MAX",
    "API_KEY_ID_MAX",
    "CREDENTIAL_MAX",
    "EXECUTION_ID_MAX",
    "EXECUTION_PAGE_MAX",
    "FILE_NAME_MAX",
    "GPUS_MAX",
    "GPU_INDEX_DIGITS",
    "GPU_UUID_MAX",
    "GRANT_TYPE_MAX",
    "HOSTNAME_MAX",
    "INT32_MAX",
    "INT32_MIN",
    "KEY_NAME_MAX",
    "NAMESPACE_MAX",
    "OFFSET_MAX",
    "ORG_SLUG_MAX",
    "PODS_MAX",
    "PODS_PER_QUERY_DEFAULT",
    "POD_NAME_MAX",
    "PROFILE_MAX",
    "PROJECT_MAX",
    "REFRESH_TOKEN_MAX",
    "RUNAI_PAGE_MAX",
    "RUNAI_SAMPLES_MAX",
    "SUMMARY_ROWS_MAX",
    "SYSTEM_ERRORS_MAX",
    "SYSTEM_ERROR_MAX",
    "USER_MAX",
    "WORKLOAD_NAME_MAX",
]

# -- names and ids --------------------------------------------------------------------------------
ORG_SLUG_MAX = 63  # [a-z0-9][a-z0-9-]*: a DNS label
PROJECT_MAX = 128  # [A-Za-z0-9][A-Za-z0-9._-]*
USER_MAX = 128  # [A-Za-z0-9][A-Za-z0-9._@+-]*: a login or an e-mail address
EXECUTION_ID_MAX = 128  # [A-Za-z0-9._:-]+
HOSTNAME_MAX = 253  # [A-Za-z0-9][A-Za-z0-9._-]*: a DNS name; also a pod's node
KEY_NAME_MAX = 255  # an API key's label for people (1..KEY_NAME_MAX after trimming)
API_KEY_ID_MAX = 64  # a key id in a path (ids are UUIDs: 36); longer is not looked up
WORKLOAD_NAME_MAX = 253  # no control characters
POD_NAME_MAX = 253  # a Kubernetes pod name: an RFC 1123 subdomain
NAMESPACE_MAX = 63  # a Kubernetes namespace: an RFC 1123 label

# -- POST /api/v1/token ---------------------------------------------------------------------------
GRANT_TYPE_MAX = 64
CREDENTIAL_MAX = 512  # a client id or secret (an `lk_` key, its prefix, name or id)
REFRESH_TOKEN_MAX = 8192  # a refresh token (a JWT)

# -- GPUs -----------------------------------------------------------------------------------------
GPUS_MAX = 1024  # GPUs named by one execution or pod
GPU_INDEX_DIGITS = 4  # a GPU index: 0..9999
GPU_UUID_MAX = 64  # characters after `GPU-` / `MIG-`

# -- execution fields -----------------------------------------------------------------------------
PROFILE_MAX = 255  # hardware_profile, execution_type
FILE_NAME_MAX = 1024
SYSTEM_ERRORS_MAX = 100  # entries of system_errors
SYSTEM_ERROR_MAX = 4096  # characters of one entry
INT32_MIN = -(2**31)  # return_code
INT32_MAX = 2**31 - 1

# -- counts and pages -----------------------------------------------------------------------------
PODS_MAX = 10_000  # pods in one workload registration
EXECUTION_PAGE_MAX = 1000  # `limit` of an execution listing (Lyceum history, admin, CLI)
RUNAI_PAGE_MAX = 500  # `limit` of a Run:ai listing (Run:ai's own maximum), workload listings
OFFSET_MAX = 10**9  # `offset` of a listing
ACTIVE_EXECUTIONS_MAX = 10_000  # /workloads/list has no paging: this only bounds a pathological org
RUNAI_SAMPLES_MAX = 1000  # Run:ai's numberOfSamples
SUMMARY_ROWS_MAX = 100  # execution ids one /execution-summaries request names (the dashboard's list)
PODS_PER_QUERY_DEFAULT = 500  # pods one workload read may select (GPULENS_MAX_PODS_PER_QUERY)
