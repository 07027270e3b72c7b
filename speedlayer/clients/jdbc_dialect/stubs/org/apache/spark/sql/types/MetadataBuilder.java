package org.apache.spark.sql.types;

public class MetadataBuilder {}
