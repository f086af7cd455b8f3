"""Cormorant's Pulumi program: one ComponentResource per concern, wired in :mod:`.stack`.

network (VPC, subnets, NAT, security groups), kafka (MSK), cache (ElastiCache Redis),
database (RDS PostgreSQL), ingress (NLB), compute (ECS Fargate services and the topics
task), analytics (S3 archive, EMR Serverless), observability (alarms). :mod:`.config`
validates the stack's configuration; :mod:`.shared` imports Cormorant's own facts.
"""
