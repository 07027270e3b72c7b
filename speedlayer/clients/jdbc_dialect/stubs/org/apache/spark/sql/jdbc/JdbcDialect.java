package org.apache.spark.sql.jdbc;

import org.apache.spark.sql.types.DataType;
import org.apache.spark.sql.types.MetadataBuilder;

public abstract class JdbcDialect implements java.io.Serializable {
    public JdbcDialect() {}

    public abstract boolean canHandle(String url);

    public scala.Option<DataType> getCatalystType(int sqlType, String typeName, int size, MetadataBuilder md) {
        return scala.Option.empty();
    }
}
