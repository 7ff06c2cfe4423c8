#!/usr/bin/env python3
"""moto's S3 server on 127.0.0.1 for the S3 client tests.

Starts moto's ThreadedMotoServer on a free port and prints one line on
stdout once it answers: the port, and with --auth the credentials to use.
Serves until stdin closes (the test that started it exits) or until killed.

--auth turns on moto's request authentication (as INITIAL_NO_AUTH_ACTION_COUNT=0
would): every request must then be SigV4-signed with a key moto knows, and
moto checks the signature. The line printed is then
    PORT KEY_ID SECRET TEMP_KEY_ID TEMP_SECRET SESSION_TOKEN
the keys of an IAM user allowed s3:*, and temporary credentials of a role
allowed s3:* (AssumeRole), whose requests carry x-amz-security-token.
"""
import argparse
import json
import logging
import sys

def policy(*actions):
    return json.dumps({"Version": "2012-10-17", "Statement": [
        {"Effect": "Allow", "Action": list(actions), "Resource": "*"}]})


def make_credentials(endpoint):
    """Creates an IAM user and a role, both allowed s3:*; returns their keys."""
    import boto3  # moto depends on boto3

    def client(service, **creds):
        creds = creds or {"aws_access_key_id": "setup", "aws_secret_access_key": "setup"}
        return boto3.client(service, endpoint_url=endpoint, region_name="us-east-1", **creds)

    iam = client("iam")
    user = iam.create_user(UserName="shardsafe-test")["User"]
    iam.put_user_policy(UserName="shardsafe-test", PolicyName="s3",
                        PolicyDocument=policy("s3:*", "sts:AssumeRole"))
    key = iam.create_access_key(UserName="shardsafe-test")["AccessKey"]
    trust = json.dumps({"Version": "2012-10-17", "Statement": [{
        "Effect": "Allow", "Principal": {"AWS": user["Arn"]}, "Action": "sts:AssumeRole"}]})
    role = iam.create_role(RoleName="shardsafe-test", AssumeRolePolicyDocument=trust)["Role"]
    iam.put_role_policy(RoleName="shardsafe-test", PolicyName="s3", PolicyDocument=policy("s3:*"))
    return key, role["Arn"]


def assume_role(endpoint, key, role_arn):
    import boto3
    sts = boto3.client("sts", endpoint_url=endpoint, region_name="us-east-1",
                       aws_access_key_id=key["AccessKeyId"],
                       aws_secret_access_key=key["SecretAccessKey"])
    return sts.assume_role(RoleArn=role_arn, RoleSessionName="test")["Credentials"]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--auth", action="store_true", help="check every request's signature")
    args = parser.parse_args()

    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # no line per request
    from moto import settings
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    port = server.get_host_and_port()[1]
    endpoint = f"http://127.0.0.1:{port}"
    fields = [str(port)]
    if args.auth:
        key, role_arn = make_credentials(endpoint)
        # The server runs in this process: from here on every request is checked.
        settings.INITIAL_NO_AUTH_ACTION_COUNT = 0
        temp = assume_role(endpoint, key, role_arn)
        fields += [key["AccessKeyId"], key["SecretAccessKey"], temp["AccessKeyId"],
                   temp["SecretAccessKey"], temp["SessionToken"]]
    print(" ".join(fields), flush=True)
    sys.stdin.read()  # until the test closes its end
    server.stop()


if __name__ == "__main__":
    main()
