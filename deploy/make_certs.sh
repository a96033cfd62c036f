#!/usr/bin/env bash
# Makes what a TLS + token env server needs, with openssl: a private CA, a server certificate signed by
# it, a client certificate (for mTLS) and a tokens file. Existing files are kept (run again: no change).
#
#   deploy/make_certs.sh [DIR [NAME...]]     # DIR defaults to .build/certs (git-ignored)
#
# NAME: every host name or IP address clients dial, e.g. tito-env.tito.svc.cluster.local or 10.0.0.5;
# localhost and 127.0.0.1 are always in the certificate (the container's own health check dials them).
#
# DIR then holds: ca.pem (give it to clients: TlsOptions(ca_file=...)), ca.key (keep it offline),
# server.pem + server.key (TITO_TLS__CERT_FILE / TITO_TLS__KEY_FILE), client.pem + client.key (a client
# identity for mTLS: set TITO_TLS__CLIENT_CA_FILE=ca.pem on the server), tokens (TITO_AUTH__TOKENS_FILE;
# hand each client one line of it).
set -euo pipefail

dir=${1:-.build/certs}
[[ $# -gt 0 ]] && shift
command -v openssl >/dev/null || { echo "error: openssl is not installed (apt-get install -y openssl)" >&2; exit 1; }
mkdir -p "$dir"
cd "$dir"
umask 077

san="DNS:localhost,IP:127.0.0.1"
for name in "$@"; do
    if [[ $name =~ ^[0-9.]+$ || $name == *:* ]]; then san+=",IP:$name"; else san+=",DNS:$name"; fi
done
days=825  # the longest validity clients commonly accept for a leaf certificate
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }

if [[ ! -s ca.pem ]]; then
    key ca.key
    openssl req -x509 -new -key ca.key -days "$days" -subj "/CN=tito private CA" -out ca.pem \
        -addext "basicConstraints=critical,CA:TRUE,pathlen:0" -addext "keyUsage=critical,keyCertSign,cRLSign"
    echo "made ca.pem (CA) and ca.key"
fi

issue() {  # issue NAME EXTENSIONS
    [[ -s $1.pem ]] && return
    key "$1.key"
    openssl req -new -key "$1.key" -subj "/CN=tito $1" -out "$1.csr"
    openssl x509 -req -in "$1.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days "$days" -out "$1.pem" \
        -extfile <(printf '%b' "$2") 2>/dev/null
    rm -f "$1.csr"
    echo "made $1.pem and $1.key"
}
issue server "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=serverAuth\nsubjectAltName=$san\n"
issue client "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\nextendedKeyUsage=clientAuth\n"
rm -f ca.srl

if [[ ! -s tokens ]]; then
    { echo "# bearer tokens accepted by the env server, one a line"; openssl rand -hex 32; } > tokens
    echo "made tokens (one token)"
fi
openssl x509 -in server.pem -noout -ext subjectAltName | tail -n +2 | sed "s/^ */server certificate names: /"
